"""Step 4: which Lightning tests exercise only the public API ("public") and which reach into Lightning's
internals ("private"), decided per test function from the ORIGINAL (un-renamed) source with ``ast``.

A test is private when the code it runs in its file (its body and decorators, its ``parametrize`` values, the
fixtures of the file it requests, and, transitively, the module-level functions, classes and assignments of the
file it names) does any of:

1. reads or writes an attribute whose name has one leading underscore (``trainer._logger_connector``,
   ``fit_loop.epoch_loop._batches_that_stepped``), also through ``getattr``/``setattr``/``hasattr`` with a string;
   except on ``self``/``cls`` and except names the test file itself defines (its classes' own ``_helpers`` and
   ``self._state``), except torch's own (:data:`TORCH_ATTRS`: ``module._modules``) and except on modules
   outside Lightning (``torch._C``, ``os._exit``);
2. imports a ``_``-prefixed name from Lightning, or anything from a private Lightning module (a path component
   starting with ``_``, or one of :data:`PRIVATE_MODULES`: connectors, loops, launchers, overrides, testing),
   or walks into one through an imported module (``lightning.pytorch.loops.fit_loop``);
3. patches Lightning: ``mock.patch("lightning...")``/``monkeypatch.setattr("lightning...")`` with a target that
   is not a public method of a public class (``...loggers.TensorBoardLogger.log_metrics`` is public: the test
   observes calls through the documented API; ``...callbacks.ModelCheckpoint`` or
   ``...model_checkpoint.os.symlink`` replaces what a module looks up, so it is private), or
   ``patch.object``/``monkeypatch.setattr`` of a ``_``-prefixed attribute or of anything on a Lightning module.

Otherwise it is public. Every id of a parametrized test gets its function's class.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

LIGHTNING_ROOTS = ("lightning", "pytorch_lightning", "lightning_fabric")

#: Lightning modules whose contents are internal even where a name lacks the leading underscore.
PRIVATE_MODULES = (
    "lightning.pytorch.trainer.connectors",
    "lightning.pytorch.loops",
    "lightning.pytorch.overrides",
    "lightning.pytorch.strategies.launchers",
    "lightning.pytorch.utilities.testing",
    "lightning.pytorch.utilities.migration",
    "lightning.fabric.strategies.launchers",
    "lightning.fabric.utilities.testing",
)


#: torch's own underscore attributes that Lightning tests read on torch objects (not Lightning internals).
TORCH_ATTRS = frozenset({"_modules", "_parameters", "_buffers", "_per_optimizer_states", "_step_count"})


def _normal(path: str) -> str:
    """Lightning's package spellings as one (``pytorch_lightning.x`` -> ``lightning.pytorch.x``)."""
    for old, new in (("pytorch_lightning", "lightning.pytorch"), ("lightning_fabric", "lightning.fabric")):
        if path == old or path.startswith(old + "."):
            return new + path[len(old) :]
    return path


def _is_lightning(path: str) -> bool:
    return path.split(".")[0] in LIGHTNING_ROOTS


def _single_underscore(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def private_module(path: str) -> bool:
    """Whether a (Lightning) module path is internal."""
    path = _normal(path)
    if any(_single_underscore(p) for p in path.split(".")):
        return True
    return any(path == m or path.startswith(m + ".") for m in PRIVATE_MODULES)


def public_patch_target(target: str) -> bool:
    """Whether ``mock.patch(target)`` of a Lightning string replaces a public method/property of a public
    class (``...TensorBoardLogger.log_metrics``) rather than something a module looks up."""
    parts = _normal(target).split(".")
    if any(p.startswith("_") for p in parts) or private_module(target):
        return False
    return len(parts) >= 3 and parts[-2][:1].isupper() and not parts[-1][:1].isupper()


@dataclass
class TestClass:
    """The classification of one test function (``name`` is ``func`` or ``Class::func``)."""

    name: str
    public: bool = True
    reasons: list[str] = field(default_factory=list)
    #: Aliases of module-level imports the test uses (transitively), for marking missing names.
    imports_used: set[str] = field(default_factory=set)


class _FileIndex:
    """Module-level names of one test file and what each import refers to."""

    def __init__(self, tree: ast.Module) -> None:
        self.defs: dict[str, ast.AST] = {}
        self.imports: dict[str, str] = {}  # alias -> dotted path (module or module.name)
        self.fixtures: set[str] = set()
        self.own_attrs: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
                if any("fixture" in ast.unparse(d) for d in getattr(node, "decorator_list", [])):
                    self.fixtures.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.defs[n.id] = node
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.ClassDef):  # names the test file gives its own classes
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.own_attrs.add(item.name)
                    elif isinstance(item, ast.Assign):
                        self.own_attrs.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                self.own_attrs.add(node.attr)

    def dotted(self, node: ast.AST) -> str | None:
        """The dotted path an expression names when it starts at an imported name (``pl.loops.x``)."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.imports:
            return ".".join([self.imports[node.id], *reversed(parts)])
        return None

    def root_is_foreign_module(self, node: ast.AST) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.imports and not _is_lightning(self.imports[node.id])


def _import_reasons(node: ast.AST) -> list[str]:
    out = []
    if isinstance(node, ast.ImportFrom) and node.module and _is_lightning(node.module):
        for a in node.names:
            if _single_underscore(a.name) or private_module(node.module):
                out.append(f"imports {node.module}.{a.name}")
    elif isinstance(node, ast.Import):
        out += [f"imports {a.name}" for a in node.names if _is_lightning(a.name) and private_module(a.name)]
    return out


def _call_name(func: ast.AST) -> str:
    return ast.unparse(func)


def _patch_reasons(call: ast.Call, index: _FileIndex) -> list[str]:
    name = _call_name(call.func)
    is_patch = name.endswith("patch") or name.endswith("patch.object") or name.endswith("patch.multiple")
    is_monkey = name.startswith("monkeypatch.") and name.split(".")[-1] in ("setattr", "delattr")
    if not (is_patch or is_monkey) or not call.args:
        return []
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        target = first.value
        if _is_lightning(target) and not public_patch_target(target):
            return [f"patches {target}"]
        return []
    if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
        attr = call.args[1].value
        path = index.dotted(first)
        if path and _is_lightning(path) and (private_module(path) or not path.split(".")[-1][:1].isupper()):
            return [f"patches {path}.{attr}"]  # something a Lightning module looks up
        if _single_underscore(attr) and attr not in index.own_attrs:
            return [f"patches {ast.unparse(first)}.{attr}"]
    return []


def _node_reasons(node: ast.AST, index: _FileIndex) -> list[str]:
    """The private uses inside ``node`` itself (not following references)."""
    reasons: list[str] = []
    for sub in ast.walk(node):
        reasons += _import_reasons(sub)
        if isinstance(sub, ast.Attribute):
            path = index.dotted(sub)
            if path and _is_lightning(path) and private_module(path):
                reasons.append(f"uses {path}")
            elif (
                _single_underscore(sub.attr)
                and sub.attr not in index.own_attrs
                and sub.attr not in TORCH_ATTRS
                and not (isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"))
                and not index.root_is_foreign_module(sub.value)
            ):
                reasons.append(f"reads {ast.unparse(sub)[:80]}")
        elif isinstance(sub, ast.Name) and sub.id in index.imports:
            path = index.imports[sub.id]
            if _is_lightning(path) and (private_module(path) or _single_underscore(path.split(".")[-1])):
                reasons.append(f"uses {path}")
        elif isinstance(sub, ast.Call):
            reasons += _patch_reasons(sub, index)
            fname = _call_name(sub.func)
            if fname in ("getattr", "setattr", "hasattr", "delattr") and len(sub.args) >= 2:
                arg = sub.args[1]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if _single_underscore(arg.value) and arg.value not in index.own_attrs:
                        reasons.append(f"{fname}(..., {arg.value!r})")
    return reasons


def _referenced(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _classify(name: str, roots: list[ast.AST], index: _FileIndex) -> TestClass:
    result = TestClass(name)
    seen: set[int] = set()
    todo = list(roots)
    for root in roots:  # fixtures of the file the test requests
        if isinstance(root, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += [index.defs[a.arg] for a in root.args.args if a.arg in index.fixtures]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        result.reasons += _node_reasons(node, index)
        for ref in _referenced(node):
            if ref in index.imports:
                result.imports_used.add(ref)
            if ref in index.defs:
                todo.append(index.defs[ref])
    result.reasons = sorted(set(result.reasons))
    result.public = not result.reasons
    return result


def classify_source(source: str) -> dict[str, TestClass]:
    """Classify every test of one file: ``{"test_x" or "TestCls::test_x": TestClass}``."""
    tree = ast.parse(source)
    index = _FileIndex(tree)
    out: dict[str, TestClass] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            out[node.name] = _classify(node.name, [node], index)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            shared = [n for n in node.body if not (isinstance(n, ast.FunctionDef) and n.name.startswith("test"))]
            shared += node.decorator_list + node.bases
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    key = f"{node.name}::{item.name}"
                    out[key] = _classify(key, [item, *shared], index)
    return out


def classify_file(path: Path) -> dict[str, TestClass]:
    """:func:`classify_source` of a file."""
    return classify_source(path.read_text())


def import_paths(source: str) -> dict[str, str]:
    """Alias -> dotted path of every import in a file (``{"Trainer": "lightning.pytorch.Trainer"}``)."""
    return _FileIndex(ast.parse(source)).imports
