"""The layers of docs/architecture.md, checked on the source with ``ast`` (nothing is imported).

Nodes are packages: ``strategies``, ``callbacks``, ``loggers``, and ``trainer`` split into its packages
(``trainer`` itself holds the root modules: the Trainer, TrainerCLI, hook dispatch). A module belongs to the
innermost of them that holds it. Every import counts, also those under ``TYPE_CHECKING`` and inside functions:
a lazy import still ties two packages together. ``__main__.py`` files are entry points, imported by nothing.
"""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("trainer", "callbacks", "loggers", "strategies")
# The short-name alias in each sibling's __init__ (a source checkout's ``import strategies``) is the namespace's
# plumbing, not a dependency of the package on the Trainer.
NAMESPACE_PLUMBING = {"trainer._source_layout", "trainer._source_layout.alias_short_name"}


def packages() -> set[str]:
    """The nodes: the four top-level packages and every package inside ``trainer``."""
    inner = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "trainer").rglob("__init__.py")}
    return set(TOP_PACKAGES) | inner


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
    """One circle of imports between packages, as a path that ends where it starts, or []."""
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
    upward = {target: files for target, files in package_imports()["strategies"].items()
              if target.split(".")[0] in ("trainer", "callbacks", "loggers")}  # fmt: skip
    assert not upward, f"strategies/ must not import these (they sit above it): {upward}"


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
