"""Which failures touch something the migration doc already gives as a deliberate difference.

The doc's tables mark Lightning names **partly** or **not supported** (with the reason). A failure whose error
names one of them (``'Trainer' object has no attribute 'validate_loop'``, ``val_check_interval='00:00:00:06' ...``,
``Tuner.scale_batch_size(method='validate')``) is flagged as documented: a hint for triage, not a verdict (the
test may fail for another reason that merely mentions the name).
"""

from __future__ import annotations

import re
from pathlib import Path

_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(partly|not supported)\s*\|")


def documented_names(doc: Path) -> set[str]:
    """The last component of every Lightning name a table row marks partly or not supported."""
    names = set()
    for line in doc.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            names.add(match.group(1).rsplit(".", 1)[-1])
    return names


def documented_in(error: str, names: set[str]) -> str:
    """The documented name the error mentions (as a whole word, not inside a dotted module path), or ``""``."""
    for word in re.findall(r"(?<![\w.])[A-Za-z_]\w*", error):
        if word in names:
            return word
    return ""
