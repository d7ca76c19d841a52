"""``trainwright``: the framework under its distribution's name, for projects that have a ``trainer.py`` of their
own (Fabric's "build your own trainer" example has one) and so cannot ``import trainer``.

``import trainwright`` gives the ``trainer`` package itself, and ``trainwright.X`` is the module ``trainer.X`` (the
same objects, not a copy): ``from trainwright import Trainer`` and ``from trainwright.fabric import Fabric`` work
whatever ``trainer`` means in the user's project. When the name ``trainer`` is the user's (their module is
imported already, or their ``trainer.py`` comes first on ``sys.path``), the framework is loaded from beside this
package with all its subpackages, and the name ``trainer`` is handed back to the user's module.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

_FRAMEWORK = Path(__file__).resolve().parent.parent / "trainer"
_SIBLINGS = ("callbacks", "loggers", "strategies")


def _is_framework(module: Optional[ModuleType]) -> bool:
    origin = getattr(module, "__file__", None)
    return origin is not None and Path(origin).resolve() == _FRAMEWORK / "__init__.py"


def _users_name() -> bool:
    """Whether ``trainer`` means the user's module: imported already, or what ``import trainer`` would find."""
    loaded = sys.modules.get("trainer")
    if loaded is not None:
        return not _is_framework(loaded)
    spec = importlib.util.find_spec("trainer")
    return spec is None or spec.origin is None or Path(spec.origin).resolve() != _FRAMEWORK / "__init__.py"


def _load_framework() -> ModuleType:
    """The framework's ``trainer`` package; under a user's ``trainer`` it is loaded from its own folder with every
    subpackage (so the framework's later imports of ``trainer.X.Y`` find their parents), then the name goes back."""
    if not _users_name():
        return importlib.import_module("trainer")
    users = sys.modules.get("trainer")
    spec = importlib.util.spec_from_file_location("trainer", _FRAMEWORK / "__init__.py",
                                                  submodule_search_locations=[str(_FRAMEWORK)])  # fmt: skip
    framework = importlib.util.module_from_spec(spec)
    sys.modules["trainer"] = framework
    try:
        spec.loader.exec_module(framework)
        children = [info.name for info in pkgutil.iter_modules([str(_FRAMEWORK)]) if info.name != "__main__"]
        for name in [*children, *_SIBLINGS]:
            importlib.import_module(f"trainer.{name}")
    finally:
        if users is not None:
            sys.modules["trainer"] = users
        else:
            del sys.modules["trainer"]  # `import trainer` finds the user's file, as before
    return framework


class _AliasLoader(importlib.abc.Loader):
    """Loads ``trainwright.X`` as the module ``trainer.X`` itself (``sys.modules`` points at it; the framework's
    module keeps its own name and spec)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        """The default: a placeholder that :meth:`exec_module` replaces."""
        return None

    def exec_module(self, module: ModuleType) -> None:
        """Point ``sys.modules`` at the framework's module (the import statement returns what is there)."""
        sys.modules[module.__name__] = _submodule(module.__name__.partition(".")[2])


def _submodule(name: str) -> ModuleType:
    full = f"trainer.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if sys.modules.get("trainer") is not _TRAINER and "." not in name:
        # Every subpackage was loaded with the framework: this one does not exist.
        raise ModuleNotFoundError(f"No module named 'trainwright.{name}'", name=f"trainwright.{name}")
    return importlib.import_module(full)  # its parent is loaded, so a user's `trainer` is never consulted


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Sends ``trainwright.X`` to ``trainer.X``."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:  # fmt: skip
        if not fullname.startswith("trainwright."):
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader())


_TRAINER = _load_framework()
if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
sys.modules[__name__] = _TRAINER
