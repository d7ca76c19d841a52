"""``pytorch_lightning.utilities.model_helpers`` after the rename: ``is_overridden``, which a callback or a
plug-in uses to ask whether the user implemented a hook (the same rule the Trainer uses to decide what to call)."""
from __future__ import annotations

from typing import Any, Optional

from trainer.callbacks.callback import Callback
from trainer.module.datamodule import DataModule
from trainer.module.overrides import implements
from trainer.module.train_module import TrainModule
from trainer.strategies.errors import ConfigurationError


def is_overridden(method_name: str, instance: Optional[object] = None, parent: Optional[type] = None) -> bool:
    """Whether ``instance`` implements ``method_name`` differently from ``parent`` (by default the framework class
    it derives from: ``TrainModule``, ``DataModule`` or ``Callback``). ``None`` as instance gives False; a method
    set to ``None`` on the instance, or a ``functools.wraps``/``partial`` wrapper around the inherited one, is not
    an override."""
    if instance is None:
        return False
    if parent is None:
        parent = next((base for base in (TrainModule, DataModule, Callback) if isinstance(instance, base)), None)
        if parent is None:
            raise ConfigurationError(
                f"is_overridden({method_name!r}, ...) needs parent= for a {type(instance).__name__}: the class whose "
                "method counts as not overridden (a TrainModule, DataModule or Callback is recognised by itself)."
            )
    if getattr(parent, method_name, None) is None:
        raise ConfigurationError(f"is_overridden: {parent.__name__} has no method {method_name!r} to override.")
    return implements(instance, parent, method_name)


__all__ = ["is_overridden"]
