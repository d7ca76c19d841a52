"""Hook dispatch: look up once who overrides which hook, then call only those.

Order between the module and callbacks for one hook, as in Lightning: the callbacks first, then the module,
on every hook. Two exceptions: on restore, the module's ``on_load_checkpoint`` runs first (it may edit the
checkpoint before the weights load); on ``on_train_epoch_end`` the callbacks that monitor a metric
(checkpointing, early stopping, the timer) run after the module, so they see what it logged there; the others
run before it.
``setup`` and ``teardown`` get ``stage=`` as a keyword, as in Lightning.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Optional

from trainer.callbacks.callback import CALLBACK_HOOKS, Callback
from trainer.callbacks.early_stopping import EarlyStopping
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.callbacks.rich_progress import RichProgressBar
from trainer.callbacks.timer import Timer
from trainer.module.overrides import overrides
from trainer.module.train_module import TrainModule

# Module hooks whose TrainModule signature differs from the callback's by more than (trainer, module).
_MODULE_HOOKS = frozenset(h for h in CALLBACK_HOOKS if h not in ("on_sanity_check_start", "on_sanity_check_end", "on_exception"))
#: Callbacks that decide on logged metrics (Lightning's "monitoring callbacks"): on ``on_train_epoch_end`` they run
#: after the module's hook. The progress bar too, so its epoch line shows what the module logged there (its place
#: is invisible to a user's code).
MONITORING_CALLBACKS = (ModelCheckpoint, EarlyStopping, Timer, RichProgressBar)


class HookDispatcher:
    """Calls a hook on the callbacks and the module that implement it, in the documented order."""

    def __init__(self, callbacks: Iterable[Callback], module: TrainModule) -> None:
        callbacks = list(callbacks)
        self.callback_hooks: dict[str, list[Callable[..., Any]]] = {
            name: [getattr(cb, name) for cb in callbacks if overrides(cb, Callback, name)] for name in CALLBACK_HOOKS
        }
        #: For each of ``callback_hooks["on_train_epoch_end"]``: whether its callback is a monitoring one.
        self.monitors_train_epoch_end: list[bool] = [
            isinstance(cb, MONITORING_CALLBACKS) for cb in callbacks if overrides(cb, Callback, "on_train_epoch_end")
        ]
        self.module_hooks: dict[str, Callable[..., Any]] = {
            name: getattr(module, name) for name in _MODULE_HOOKS if overrides(module, TrainModule, name)
        }

    def caller(self, trainer: Any, name: str) -> Optional[Callable[..., Any]]:
        """A callable running hook ``name`` in order, or ``None`` when nobody implements it.

        The per-batch loop resolves its hooks once with this, so an unimplemented hook costs one
        ``is not None`` check per batch.
        """
        if name not in self.module_hooks and not self.callback_hooks.get(name):
            return None
        return functools.partial(self, trainer, name)

    def __call__(self, trainer: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        for hook in self.callback_hooks.get(name, ()):
            hook(trainer, trainer.module, *args, **kwargs)
        module_hook = self.module_hooks.get(name)
        return module_hook(*args, **kwargs) if module_hook is not None else None

    def module_then_callbacks(self, trainer: Any, name: str, *args: Any,
                              before_callbacks: Optional[Callable[[], Any]] = None) -> None:  # fmt: skip
        """Hook ``name`` on the module first, then ``before_callbacks()``, then on the callbacks: Lightning's order
        for ``on_load_checkpoint`` on restore (the module may still edit the checkpoint before its weights load)."""
        module_hook = self.module_hooks.get(name)
        if module_hook is not None:
            module_hook(*args)
        if before_callbacks is not None:
            before_callbacks()
        for hook in self.callback_hooks.get(name, ()):
            hook(trainer, trainer.module, *args)

    def train_epoch_end(self, trainer: Any, between: Callable[[], None]) -> None:
        """``on_train_epoch_end``: the other callbacks, the module, ``between()``, then the monitoring callbacks."""
        hooks = self.callback_hooks["on_train_epoch_end"]
        for hook, monitors in zip(hooks, self.monitors_train_epoch_end):
            if not monitors:
                hook(trainer, trainer.module)
        module_hook = self.module_hooks.get("on_train_epoch_end")
        if module_hook is not None:
            module_hook()
        between()
        for hook, monitors in zip(hooks, self.monitors_train_epoch_end):
            if monitors:
                hook(trainer, trainer.module)
