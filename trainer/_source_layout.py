"""The framework's three sibling packages under one namespace: ``trainer.callbacks``, ``trainer.loggers``,
``trainer.strategies``.

The repository keeps ``callbacks/``, ``loggers/`` and ``strategies/`` at its root, beside ``trainer/``. An
installed wheel puts them inside ``trainer/`` (``setup.py`` maps them), and nothing here is needed. In a source
checkout (``pip install -e .``, or the repository on ``sys.path``) :func:`install` maps the three names to the
root folders, found from this file's own location, so a worktree always imports its own copy.

The short top-level names (``import callbacks``) are not part of the distribution: ``callbacks``, ``loggers``,
``strategies`` and ``trainer`` are names other projects and users' own files take. In a checkout the root folders
still answer to them, as aliases of the same module objects (:func:`alias_short_name`), so a class imported
either way is one class; a user's own ``callbacks.py`` simply wins for that user and the framework, which imports
itself only as ``trainer.*``, is not affected.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

SIBLINGS = ("callbacks", "loggers", "strategies")
_PACKAGE_DIR = Path(__file__).resolve().parent
_ROOT = _PACKAGE_DIR.parent


class _SiblingFinder(importlib.abc.MetaPathFinder):
    """Finds ``trainer.<sibling>`` in the checkout's root folder of that name."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None):
        head, _, name = fullname.partition(".")
        if head != "trainer" or name not in SIBLINGS:
            return None
        folder = _ROOT / name
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


class _AliasLoader(importlib.abc.Loader):
    """Loads ``<short>.x`` as the module ``trainer.<short>.x`` (the same object, not a second copy)."""

    def create_module(self, spec):  # the default: an empty module, replaced in exec_module
        return None

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = importlib.import_module("trainer." + module.__name__)


class _ShortNameFinder(importlib.abc.MetaPathFinder):
    """Sends ``callbacks.x`` (once ``callbacks`` is the alias of ``trainer.callbacks``) to ``trainer.callbacks.x``."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None):
        head = fullname.partition(".")[0]
        if head not in SIBLINGS or "." not in fullname:
            return None
        aliased = sys.modules.get(head)
        if aliased is None or aliased is not sys.modules.get("trainer." + head):
            return None  # a user's own module of that name: not ours to touch
        return importlib.util.spec_from_loader(fullname, _AliasLoader())


def install() -> None:
    """Map ``trainer.callbacks``/``loggers``/``strategies`` to the root folders of a source checkout (idempotent)."""
    if (_PACKAGE_DIR / "strategies" / "__init__.py").is_file():
        return  # an installed wheel: the packages sit inside trainer/
    if not (_ROOT / "strategies" / "__init__.py").is_file():
        raise ImportError(
            f"trainer's packages callbacks/, loggers/ and strategies/ were not found beside {_PACKAGE_DIR}; "
            "reinstall the project (pip install -e . from the repository, or pip install the wheel).")
    if not any(isinstance(finder, _SiblingFinder) for finder in sys.meta_path):
        # First, ahead of the path finder and of an editable install's own mapping (which points at the checkout
        # it was installed from, not necessarily this one).
        sys.meta_path.insert(0, _SiblingFinder())
        sys.meta_path.insert(0, _ShortNameFinder())


def alias_short_name(name: str) -> None:
    """Make the short top-level ``name`` (imported from a checkout's root) the module ``trainer.<name>``."""
    warnings.warn(
        f"'import {name}' is the short name of 'trainer.{name}' and works only in a source checkout; "
        f"import trainer.{name} instead (the installed package has no top-level '{name}').",
        DeprecationWarning, stacklevel=3)
    sys.modules[name] = importlib.import_module("trainer." + name)
