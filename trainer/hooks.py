"""Hook dispatch: look up once who overrides which hook, then call only those.

Order between the module and callbacks for one hook: callbacks wrap the module. On ``*_start`` hooks
and everything before a step, callbacks run first; on ``*_end`` hooks and ``teardown`` the module runs
first, so callbacks (checkpointing, early stopping) see what the module just logged.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Optional

from trainer.callbacks.callback import CALLBACK_HOOKS, Callback
from trainer.module.overrides import overrides
from trainer.module.train_module import TrainModule

_MODULE_FIRST = frozenset(h for h in CALLBACK_HOOKS if h.endswith("_end")) | {"teardown"}
# Module hooks whose TrainModule signature differs from the callback's by more than (trainer, module).
_MODULE_HOOKS = frozenset(h for h in CALLBACK_HOOKS if h not in ("on_sanity_check_start", "on_sanity_check_end", "on_exception"))


class HookDispatcher:
    """Calls a hook on the callbacks and the module that implement it, in the documented order."""

    def __init__(self, callbacks: Iterable[Callback], module: TrainModule) -> None:
        callbacks = list(callbacks)
        self.callback_hooks: dict[str, list[Callable[..., Any]]] = {
            name: [getattr(cb, name) for cb in callbacks if overrides(cb, Callback, name)] for name in CALLBACK_HOOKS
        }
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

    def __call__(self, trainer: Any, name: str, *args: Any) -> Any:
        module_hook = self.module_hooks.get(name)
        callbacks = self.callback_hooks.get(name, ())
        if module_hook is not None and name in _MODULE_FIRST:
            result = module_hook(*args)
            for hook in callbacks:
                hook(trainer, trainer.module, *args)
            return result
        for hook in callbacks:
            hook(trainer, trainer.module, *args)
        return module_hook(*args) if module_hook is not None else None
