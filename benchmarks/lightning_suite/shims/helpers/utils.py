"""Small utilities of Lightning's test helpers, re-made."""

from __future__ import annotations

import functools
from typing import Any


def getattr_recursive(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``getattr_recursive(trainer, "fit_loop.epoch_loop")``."""
    return functools.reduce(getattr, attr.split("."), obj)
