"""``LambdaCallback(on_train_epoch_end=fn, ...)``: a callback made of plain functions, as Lightning offers it."""
from __future__ import annotations

from typing import Any, Callable

from trainer.callbacks.callback import CALLBACK_HOOKS, Callback
from trainer.strategies.errors import ConfigurationError


class LambdaCallback(Callback):
    """Each keyword names a hook and gives the function to call there, with the hook's arguments
    (``(trainer, pl_module, ...)``): ``LambdaCallback(on_train_epoch_end=lambda trainer, pl_module: ...)``."""

    def __init__(self, **hooks: Callable[..., Any]) -> None:
        unknown = sorted(set(hooks) - set(CALLBACK_HOOKS))
        if unknown:
            raise ConfigurationError(f"LambdaCallback: {unknown} are not callback hooks. Hooks: {list(CALLBACK_HOOKS)}.")
        for name, function in hooks.items():
            if function is not None:
                if not callable(function):
                    raise ConfigurationError(f"LambdaCallback({name}=...) needs a function; got {function!r}.")
                setattr(self, name, function)  # an instance attribute: the Trainer calls it as the hook
