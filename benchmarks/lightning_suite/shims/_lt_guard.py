"""Module-level imports of the renamed test files go through here (see ``rename.guard_imports``).

A name the framework lacks at its renamed path binds a :class:`MissingName` placeholder instead of failing the
file's collection: the tests that use it fail with an ``ImportError`` naming it, the others run. Nothing here
stands in for framework behaviour; a placeholder can only raise. Each missing name is appended as a JSON line to
``$LT_MISSING_LOG`` when that is set, so the report can name them.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any, NoReturn


class MissingName:
    """Stands for a name that failed to import; using it (calling, subclassing, iterating) raises ImportError,
    and it is false."""

    def __init__(self, path: str, reason: str) -> None:
        object.__setattr__(self, "_lt_path", path)
        object.__setattr__(self, "_lt_reason", reason)

    def _lt_fail(self, *_: Any, **__: Any) -> NoReturn:
        raise ImportError(f"cannot import {self._lt_path!r}: {self._lt_reason}")

    def __getattr__(self, attr: str) -> MissingName:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return MissingName(f"{self._lt_path}.{attr}", self._lt_reason)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # A module-level class deriving from a missing name still gets defined; building one raises.
        return (type(f"Missing_{self._lt_path.rsplit('.', 1)[-1]}", (), {"__init__": self._lt_fail}),)

    __call__ = __iter__ = __len__ = __enter__ = __getitem__ = _lt_fail

    def __bool__(self) -> bool:
        # False, so a module-level ``if _SOME_FLAG:`` does not fail the file's collection; the tests that name
        # the missing flag still count as failed (report.py), whatever they do.
        return False

    def __repr__(self) -> str:
        return f"<missing {self._lt_path}>"


def _record(path: str, reason: str) -> None:
    log = os.environ.get("LT_MISSING_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"name": path, "reason": reason}) + "\n")


def names(module: str, wanted: tuple[str, ...]) -> tuple[Any, ...]:
    """``from module import *wanted``, with a placeholder for each name that cannot be imported."""
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        mod, mod_error = None, f"{type(err).__name__}: {err}"
    out = []
    for name in wanted:
        if mod is not None and hasattr(mod, name):
            out.append(getattr(mod, name))
            continue
        if mod is not None:
            try:  # a submodule not yet imported
                out.append(importlib.import_module(f"{module}.{name}"))
                continue
            except ImportError:
                pass
        reason = mod_error if mod is None else f"{module!r} has no {name!r}"
        _record(f"{module}.{name}", reason)
        out.append(MissingName(f"{module}.{name}", reason))
    return tuple(out)


def module(path: str, bind_top: bool) -> Any:
    """``import path`` (binding the top package when ``bind_top``) or a placeholder when it cannot be imported."""
    try:
        mod = importlib.import_module(path)
    except ImportError as err:
        reason = f"{type(err).__name__}: {err}"
        _record(path, reason)
        return MissingName(path.split(".")[0] if bind_top else path, reason)
    return importlib.import_module(path.split(".")[0]) if bind_top else mod
