"""The layers of docs/architecture.md, checked on the source with ``ast`` (nothing is imported).

Nodes are packages: ``callbacks``, ``loggers``, ``trainer`` split into its packages (``trainer`` itself holds the
root modules: the Trainer, TrainerCLI, hook dispatch) and ``strategies`` split into its packages; the modules at
the root of ``strategies`` (the interface, the registry, the two base strategies, ...) are nodes of their own, since
they sit on different layers. A module belongs to the innermost node that holds it. Every import counts, also
those under ``TYPE_CHECKING`` and inside functions: a lazy import still ties two packages together.
``__main__.py`` files are entry points, imported by nothing.

Below the packages, no two modules import each other (directly or round a longer circle), whatever their
package: where two files need each other, the shared piece belongs below both.
"""
from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("trainer", "callbacks", "loggers", "strategies")
# The short-name alias in each sibling's __init__ (a source checkout's ``import strategies``) is the namespace's
# plumbing, not a dependency of the package on the Trainer.
NAMESPACE_PLUMBING = {"trainer._source_layout", "trainer._source_layout.alias_short_name"}


def packages() -> set[str]:
    """The nodes: the top-level packages, every package inside them, and each module at the root of ``strategies``."""
    inits = (init for top in TOP_PACKAGES for init in (ROOT / top).rglob("__init__.py"))
    inner = {".".join(init.parent.relative_to(ROOT).parts) for init in inits}
    root_modules = {f"strategies.{path.stem}" for path in (ROOT / "strategies").glob("*.py") if path.stem != "__init__"}
    return set(TOP_PACKAGES) | inner | root_modules


def package_of(module: str, nodes: set[str]) -> str:
    """The innermost node holding ``module`` (a dotted name)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in nodes:
            return ".".join(parts[:end])
    return parts[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, as absolute dotted names (``from pkg import name`` also as ``pkg.name``,
    in case ``name`` is a module)."""
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
    return {_short(name) for name in found}


def _short(module: str) -> str:
    """``trainer.strategies.x`` -> ``strategies.x``: the three sibling packages are nodes of their own (their
    folders sit at the repository root; the framework imports them under the ``trainer`` namespace)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[0] == "trainer" and parts[1] in TOP_PACKAGES[1:]:
        return ".".join(parts[1:])
    return module


def package_imports() -> dict[str, dict[str, set[str]]]:
    """``{package: {imported package: {the files importing it}}}`` for this project's packages."""
    nodes = packages()
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for top in TOP_PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "__main__.py":
                continue
            source = package_of(module_name(path), nodes)
            for name in imported_modules(path) - NAMESPACE_PLUMBING:
                if name.split(".")[0] in TOP_PACKAGES:
                    target = package_of(name, nodes)
                    if target != source:
                        graph[source][target].add(str(path.relative_to(ROOT)))
    return graph


def documented_layers() -> dict[str, int]:
    """``{package: layer}`` from the table in docs/architecture.md's "The layers" section."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The layers", 1)[1].split("```", 2)[1]
    rows = (re.match(r"\s*(-?\d+)\s+([a-z_.]+)\s", line) for line in section.splitlines())
    return {row.group(2): int(row.group(1)) for row in rows if row}


def find_cycle(graph: dict[str, dict[str, set[str]]]) -> list[str]:
    """One circle of imports (between packages or modules), as a path that ends where it starts, or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_circle_of_imports_between_packages():
    graph = package_imports()
    cycle = find_cycle(graph)
    where = [f"{a} -> {b} in {sorted(graph[a][b])}" for a, b in zip(cycle, cycle[1:])]
    assert not cycle, "import circle between packages:\n  " + "\n  ".join(where)


def test_strategies_import_nothing_of_the_trainer_callbacks_or_loggers():
    upward = {f"{source} -> {target}": files for source, targets in package_imports().items()
              if source.split(".")[0] == "strategies"
              for target, files in targets.items() if target.split(".")[0] in ("trainer", "callbacks", "loggers")}  # fmt: skip
    assert not upward, f"strategies/ must not import these (they sit above it): {upward}"


def project_modules() -> dict[str, Path]:
    """Every module of the four packages by its dotted name (short names: ``strategies.strategy``)."""
    return {module_name(path): path for top in TOP_PACKAGES for path in (ROOT / top).rglob("*.py")
            if path.name != "__main__.py"}  # fmt: skip


def module_imports(path: Path, modules: set[str]) -> dict[str, str]:
    """``{imported project module: the statement's name}`` for one file. ``from pkg import name`` imports the module
    ``pkg.name`` where there is one, else ``pkg`` itself; the ``__init__`` that Python runs before any submodule is
    not counted (every submodule would import it)."""
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found: dict[str, str] = {}

    def add(name: str) -> None:
        short = _short(name)
        if short in modules and short not in NAMESPACE_PLUMBING:
            found.setdefault(short, name)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                if _short(f"{prefix}.{alias.name}") in modules:
                    add(f"{prefix}.{alias.name}")
                else:
                    add(prefix)
    found.pop(module_name(path), None)
    return found


def module_graph() -> dict[str, dict[str, str]]:
    """``{module: {module it imports: as written}}`` over the whole project (parsed once per root and packages)."""
    return _module_graph(ROOT, TOP_PACKAGES)


@functools.lru_cache(maxsize=4)
def _module_graph(root: Path, tops: tuple[str, ...]) -> dict[str, dict[str, str]]:
    modules = project_modules()
    names = set(modules)
    return {name: module_imports(path, names) for name, path in modules.items()}


def test_no_two_modules_import_each_other_round_any_circle():
    """A circle between two files (``checkpoint_io`` <-> ``checkpoint_manifest``, ``engine`` <-> ``state``, ``fit_loop``
    <-> ``host``, ``strategy`` <-> ``sharded_checkpoint``, ...) means one holds two concepts or the shared piece
    belongs below both; a type hint is described as a Protocol where it is used rather than imported."""
    graph = module_graph()
    cycle = find_cycle(graph)  # type: ignore[arg-type]
    where = [f"{a} imports {graph[a][b]}" for a, b in zip(cycle, cycle[1:])]
    assert not cycle, "import circle between modules:\n  " + "\n  ".join(where)


#: What the strategy interface may import of strategies/: the exceptions and rank helpers, the precision interface it
#: holds, the speed options every strategy applies to its module, and the single-file checkpoint plugin with its
#: atomic writes and storage (``async_checkpoint`` for the writer in a signature). No strategy, launcher, mesh or
#: sharded checkpoint format: those are implementations, and they import the interface.
INTERFACE_MAY_IMPORT = {
    "strategies.errors", "strategies.rank", "strategies.precision.base", "strategies.speed",
    "strategies.checkpoint.checkpoint_io", "strategies.checkpoint.atomic_write", "strategies.checkpoint.storage",
    "strategies.checkpoint.async_checkpoint",
}  # fmt: skip


def test_the_strategy_interface_imports_no_implementation():
    imported = module_graph()["strategies.strategy"]
    wrong = sorted(name for name in imported
                   if not any(name == ok or name.startswith(ok + ".") for ok in INTERFACE_MAY_IMPORT))  # fmt: skip
    assert not wrong, (
        f"strategies/strategy.py (the interface) imports implementation modules {wrong}: have the implementation "
        "override the method (see checkpoint/whole_folder.py) or move the shared piece below the interface."
    )


def test_callbacks_reach_the_trainer_only_through_their_documented_surface():
    """``callbacks/host.py`` is the one file of callbacks/ that imports from trainer/, and only the names it exports;
    the rest of callbacks/ imports callbacks, strategies and loggers (the siblings below or beside it)."""
    siblings = ("callbacks", "strategies", "loggers")
    reaching = {
        name: sorted(target for target in imports if target.split(".")[0] not in siblings)
        for name, imports in module_graph().items()
        if name.split(".")[0] == "callbacks" and name != "callbacks.host"
    }
    reaching = {name: targets for name, targets in reaching.items() if targets}
    assert not reaching, f"import these from trainer.callbacks.host (the callbacks' surface) instead: {reaching}"

    host = ast.parse((ROOT / "callbacks" / "host.py").read_text())
    exported = next(ast.literal_eval(node.value) for node in host.body if isinstance(node, ast.Assign)
                    and any(getattr(target, "id", None) == "__all__" for target in node.targets))  # fmt: skip
    from_trainer = {alias.asname or alias.name for node in ast.walk(host) if isinstance(node, ast.ImportFrom)
                    and (node.module or "").split(".")[0] == "trainer"
                    and (node.module or "").split(".")[1] not in siblings
                    for alias in node.names}  # fmt: skip
    unexported = sorted(from_trainer - set(exported))
    assert not unexported, f"callbacks/host.py imports {unexported} from trainer/ without exporting them in __all__"


def test_the_module_walk_resolves_what_python_imports(tmp_path, monkeypatch):
    """``from pkg import module`` is an import of the module (not of ``pkg``'s ``__init__``), ``from pkg import name``
    of ``pkg``; and a circle closed only by an import under ``TYPE_CHECKING`` is still found."""
    (tmp_path / "strategies" / "checkpoint").mkdir(parents=True)
    for name in ("__init__", "strategy", "checkpoint/__init__", "checkpoint/io"):
        (tmp_path / "strategies" / f"{name}.py").write_text("")
    (tmp_path / "strategies" / "strategy.py").write_text("from trainer.strategies.checkpoint import io\n")
    (tmp_path / "strategies" / "checkpoint" / "io.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.strategies.strategy import Strategy\n"
        "from trainer.strategies import ConfigurationError\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "TOP_PACKAGES", ("trainer", "strategies"))
    graph = module_graph()
    assert graph["strategies.strategy"] == {"strategies.checkpoint.io": "trainer.strategies.checkpoint.io"}
    assert set(graph["strategies.checkpoint.io"]) == {"strategies.strategy", "strategies"}
    assert find_cycle(graph) in (  # type: ignore[arg-type]
        ["strategies.checkpoint.io", "strategies.strategy", "strategies.checkpoint.io"],
        ["strategies.strategy", "strategies.checkpoint.io", "strategies.strategy"],
    )


def test_every_import_goes_down_the_documented_layers():
    layers = documented_layers()
    missing = sorted(packages() - set(layers))
    assert not missing, f"packages with no layer in docs/architecture.md's table: {missing}"
    wrong = [
        f"{source} (layer {layers[source]}) imports {target} (layer {layers[target]}) in {sorted(files)}"
        for source, targets in package_imports().items()
        for target, files in targets.items()
        if layers[target] >= layers[source]
    ]
    assert not wrong, "imports that do not go to a lower layer:\n  " + "\n  ".join(wrong)


def test_the_walk_sees_lazy_and_type_checking_imports(tmp_path, monkeypatch):
    """The checks above are only as good as the walk: an import inside a function or under TYPE_CHECKING counts,
    and relative imports resolve to their package."""
    source = tmp_path / "trainer" / "loops" / "probe.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from trainer.trainer import Trainer\n"
        "def f():\n    from ..faults import monitor\n    import trainer.callbacks.callback\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    found = imported_modules(source)
    assert {"trainer.trainer", "trainer.faults", "trainer.faults.monitor", "callbacks.callback"} <= found


def test_every_public_name_of_strategies_resolves_and_the_heavy_ones_load_on_first_use():
    # A fresh interpreter: `import trainer.strategies` must not load the multi-process strategies (import time), and every
    # name in its __all__ (``from trainer.strategies import DeepSpeedStrategy``) must resolve to the class in its module.
    import subprocess
    import sys

    probe = (
        "import sys, importlib\nimport trainer.strategies as strategies\n"
        "lazy = ['trainer.strategies.data_parallel.ddp', 'trainer.strategies.data_parallel.deepspeed', 'trainer.strategies.data_parallel.fsdp', 'trainer.strategies.nd.nd_parallel']\n"
        "assert not [m for m in lazy if m in sys.modules], [m for m in lazy if m in sys.modules]\n"
        "for name in strategies.__all__:\n"
        "    value = getattr(strategies, name)\n"
        "    assert getattr(value, '__name__', name) == name, (name, value)\n"
        "assert 'deepspeed' not in sys.modules  # the package itself loads only when a DeepSpeed run starts\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
