"""Step 2: the mechanical rename of docs/migrating_from_lightning.md, read from the doc itself.

The rules come from three places in the doc, and nowhere else:

* the sentence heading "Public names": ``pytorch_lightning.X`` / ``lightning.pytorch.X`` -> ``trainer.X``
  (module paths);
* the first table (Lightning -> here): class names that change (``L.LightningModule`` -> ``TrainModule``), the
  log folder (``lightning_logs/version_N`` -> ``logs/version_N``) and dotted paths that change
  (``lightning.fabric.Fabric`` -> ``trainer.Engine``);
* the rows of the "Public names" table marked **renamed**: a class whose name changes (``LightningCLI`` ->
  ``TrainerCLI``) or a module whose path changes (``trainer.states.TrainerFn`` -> ``trainer.states``,
  ``profilers.Profiler`` -> ``trainer.profiler``).

The rules are applied as a user's search-and-replace would be: on the whole text of the file (code and strings),
whole words only, longest match first, in one pass (a replaced span is never renamed again).

Separately, :func:`guard_imports` makes each module-level import of the framework (or of Lightning packages
the doc gives no rename for) bind placeholders when a name is missing, so one missing name fails the tests that
use it instead of the whole file's collection (see ``shims/_lt_guard.py``).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

_ROW = re.compile(r"^\|(.+)\|\s*$")
_CODE = re.compile(r"`([^`]+)`")
_PATH_SENTENCE = re.compile(r"`pytorch_lightning\.X`\s*/\s*`lightning\.pytorch\.X`\s*→\s*`(\w+)\.X`")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")

#: Top-level packages whose module-level imports :func:`guard_imports` guards.
GUARDED_ROOTS = frozenset({"trainer", "lightning", "pytorch_lightning", "lightning_fabric"})


@dataclass(frozen=True)
class Rule:
    """One search-and-replace: ``kind`` is ``module`` (a dotted module path, matched as a prefix of longer
    paths too), ``name`` (an identifier) or ``text`` (a literal word); ``source`` quotes the doc line it came from."""

    kind: str
    old: str
    new: str
    source: str


def _rows(lines: list[str], start: int) -> list[tuple[int, list[str]]]:
    """The table rows (line number, cells) of the first table at or after line ``start``."""
    rows: list[tuple[int, list[str]]] = []
    i = start
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    while i < len(lines) and lines[i].startswith("|"):
        match = _ROW.match(lines[i])
        cells = [c.strip() for c in match.group(1).split("|")] if match else []
        if cells and not set(cells[0]) <= {"-", ":"}:
            rows.append((i + 1, cells))
        i += 1
    return rows[1:]  # drop the header row


def _heading(lines: list[str], title: str) -> int:
    for i, line in enumerate(lines):
        if line.strip() == title:
            return i
    raise SystemExit(f"docs/migrating_from_lightning.md has no heading {title!r}: the rename rules cannot be read")


def rules_from_doc(doc: Path) -> list[Rule]:
    """Read the rename rules out of the migration doc (see the module docstring); fails loudly when the doc
    no longer states the rules every Lightning file needs."""
    lines = doc.read_text().splitlines()
    rules: dict[tuple[str, str], Rule] = {}

    def add(kind: str, old: str, new: str, lineno: int) -> None:
        if old != new and (kind, old) not in rules:
            rules[(kind, old)] = Rule(kind, old, new, f"{doc.name}:{lineno}: {lines[lineno - 1].strip()[:160]}")

    for i, line in enumerate(lines):
        match = _PATH_SENTENCE.search(line)
        if match:
            add("module", "pytorch_lightning", match.group(1), i + 1)
            add("module", "lightning.pytorch", match.group(1), i + 1)

    for lineno, cells in _rows(lines, 0):  # the first table: Lightning | here
        if len(cells) < 2:
            continue
        old_codes, new_codes = _CODE.findall(cells[0]), _CODE.findall(cells[1])
        if len(old_codes) != 1 or len(new_codes) != 1:
            continue
        old, new = old_codes[0], new_codes[0]
        if old.startswith("L.") and _IDENT.match(old[2:]) and _IDENT.match(new):
            add("name", old[2:], new, lineno)  # L.LightningModule -> TrainModule
        elif "/" in old and "/" in new:
            old_head, _, old_tail = old.partition("/")
            new_head, _, new_tail = new.partition("/")
            if old_tail == new_tail:
                add("text", old_head, new_head, lineno)  # lightning_logs/version_N -> logs/version_N
        elif _DOTTED.match(old) and _DOTTED.match(new) and old.split(".")[0] != new.split(".")[0]:
            add("module", old, new, lineno)  # lightning.fabric.Fabric -> trainer.Engine

    package = rules.get(("module", "lightning.pytorch"))
    for lineno, cells in _rows(lines, _heading(lines, "## Public names")):
        if len(cells) < 3 or cells[1] != "renamed":
            continue
        old_codes = _CODE.findall(cells[0])
        ours = [c for c in _CODE.findall(cells[2]) if package and c.startswith(package.new + ".") and _DOTTED.match(c)]
        if len(old_codes) != 1 or not ours:
            continue
        old_module, _, old_name = old_codes[0].rpartition(".")
        new_module, _, new_name = ours[0].rpartition(".")
        if old_name != new_name:
            add("name", old_name, new_name, lineno)  # cli.LightningCLI -> trainer.TrainerCLI
        elif old_module and new_module != f"{package.new}.{old_module}":
            add("module", f"lightning.pytorch.{old_module}", new_module, lineno)  # trainer.states -> trainer.states

    found = {(r.kind, r.old) for r in rules.values()}
    needed = {("module", "lightning.pytorch"), ("module", "pytorch_lightning"), ("name", "LightningModule"),
              ("name", "LightningDataModule"), ("text", "lightning_logs")}  # fmt: skip
    if not needed <= found:
        raise SystemExit(f"the migration doc no longer states these renames: {sorted(needed - found)}")
    return sorted(rules.values(), key=lambda r: (-len(r.old), r.old))


def _compile(rules: list[Rule]) -> tuple[re.Pattern[str], dict[str, str]]:
    alternatives = []
    for rule in rules:  # longest first, so a module path wins over its prefix
        body = re.escape(rule.old)
        alternatives.append(rf"(?<![\w.]){body}(?![\w])" if rule.kind == "module" else rf"\b{body}\b")
    return re.compile("|".join(alternatives)), {r.old: r.new for r in rules}


def apply_rules(source: str, rules: list[Rule]) -> str:
    """``source`` with every rule applied in one pass (what a user's search-and-replace gives)."""
    pattern, table = _compile(rules)
    return pattern.sub(lambda m: table[m.group(0)], source)


def _guard_call(node: ast.stmt) -> str | None:
    """The placeholder-binding statement replacing a module-level framework import, or None to keep it."""
    guard = '__import__("tests_pytorch._lt_guard", fromlist=["_"])'
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module.split(".")[0] not in GUARDED_ROOTS or any(a.name == "*" for a in node.names):
            return None
        targets = ", ".join(a.asname or a.name for a in node.names) + ","
        names = tuple(a.name for a in node.names)
        return f"{targets} = {guard}.names({node.module!r}, {names!r})"
    if isinstance(node, ast.Import):
        parts = []
        for alias in node.names:
            if alias.name.split(".")[0] not in GUARDED_ROOTS:
                return None
            bound = alias.asname or alias.name.split(".")[0]
            parts.append(f"{bound} = {guard}.module({alias.name!r}, bind_top={alias.asname is None})")
        return "; ".join(parts)
    return None


def guard_imports(source: str) -> str:
    """Rewrite module-level imports of the framework/Lightning so a missing name binds a placeholder (which
    raises ``ImportError`` when used) instead of failing the file's collection. Line numbers are kept."""
    lines = source.splitlines(keepends=True)
    for node in reversed(ast.parse(source).body):
        call = _guard_call(node)
        if call is None:
            continue
        first, last = node.lineno - 1, node.end_lineno or node.lineno
        lines[first:last] = [call + "\n"] + ["\n"] * (last - 1 - first)
    return "".join(lines)


def rename_file(src: Path, dst: Path, rules: list[Rule]) -> None:
    """Write ``src`` renamed (and its framework imports guarded) to ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(guard_imports(apply_rules(src.read_text(), rules)))


def write_rules(rules: list[Rule], path: Path) -> None:
    """Record the rules a run applied (for the report and for review)."""
    path.write_text(json.dumps([asdict(r) for r in rules], indent=1) + "\n")
