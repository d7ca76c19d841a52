"""Attach a :class:`~trainer.profiler.Profiler` to one stage by wrapping the calls the loop already makes.

Nothing in the loops knows about profiling. While a profiler is attached, instance attributes shadow the methods
the loop looks up on each call (``strategy.training_step``, ``strategy.backward``, ``trainer._run_validation_in_fit``
...), each hook the :class:`~trainer.hooks.HookDispatcher` resolved is replaced by a timed one, and a wrapper on
the training iterator times ``next()``. :meth:`Instrumentation.remove` deletes the shadows, so without a profiler
(and after one) the loop runs its plain code.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

from trainer.profiler.profilers import Profiler


DATA_WAIT = "data wait (next batch)"


class Instrumentation:
    """The wrappers that report one stage's phases to ``profiler``."""

    def __init__(self, trainer: Any, profiler: Profiler) -> None:
        self.trainer = trainer
        self.profiler = profiler
        self._shadowed: list[tuple[Any, str]] = []
        self._hook_lists: list[tuple[list[Any], list[Any]]] = []
        self._module_hooks: dict[str, Any] = {}

    def _timed(self, action: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        start, stop = self.profiler.start, self.profiler.stop

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start(action)
            try:
                return fn(*args, **kwargs)
            finally:
                stop(action)

        return timed

    def _shadow(self, owner: Any, name: str, action: str) -> None:
        setattr(owner, name, self._timed(action, getattr(owner, name)))
        self._shadowed.append((owner, name))

    @classmethod
    def attach(cls, trainer: Any, stage: str) -> "Instrumentation":
        """Set up ``trainer.profiler`` for ``stage`` and wrap the loop's calls."""
        instrumentation = cls(trainer, trainer.profiler)
        trainer.profiler.setup(trainer, stage)
        instrumentation.install(stage)
        return instrumentation

    def detach(self, stage: str) -> None:
        """Unwrap, end the profiler's stage and print its summary on global rank 0."""
        self.remove()
        self.profiler.teardown(self.trainer, stage)
        summary = self.profiler.summary()
        if summary and self.trainer.is_global_zero:
            print(summary)

    def install(self, stage: str) -> None:
        """Wrap the strategy's steps, the hooks, logging, checkpointing, validation and the training data."""
        trainer, strategy = self.trainer, self.trainer.strategy
        self._shadow(strategy, "batch_to_device", "batch to device")
        self._shadow(strategy, "training_step", "training_step (forward)")
        self._shadow(strategy, "backward", "backward")
        self._shadow(strategy, "optimizer_step", "optimizer step")
        evaluation_step = strategy.evaluation_step
        start, stop = self.profiler.start, self.profiler.stop

        def timed_evaluation_step(step_name: str, *args: Any) -> Any:
            start(step_name)
            try:
                return evaluation_step(step_name, *args)
            finally:
                stop(step_name)

        strategy.evaluation_step = timed_evaluation_step
        self._shadowed.append((strategy, "evaluation_step"))
        for name in ("log_step", "log_train_epoch", "finish_eval"):
            self._shadow(trainer._metrics, name, "logging")
        self._shadow(trainer._checkpoint, "save", "checkpointing")
        self._shadow(trainer, "_run_validation_in_fit", "validation loop (own code)")
        self._shadow(trainer, "_run_sanity_check", "sanity check (own code)")
        self._shadow(trainer.fit_loop, "run", "training loop (own code)")
        self._wrap_datamodule_hooks()
        self._wrap_hooks()
        trainer.train_iterator_wrappers.append(self._data_wait)

    def _wrap_datamodule_hooks(self) -> None:
        """The datamodule's set-up, tear-down and state hooks, named as Lightning names them after the rename
        (``"[DataModule]MyData.setup"``); ``prepare_data`` where the class implements it (otherwise it does nothing)."""
        datamodule = self.trainer.datamodule
        if datamodule is None:
            return
        from trainer.module.datamodule import DataModule
        from trainer.module.overrides import overrides

        names = ["setup", "teardown", "state_dict", "load_state_dict"]
        if overrides(datamodule, DataModule, "prepare_data"):
            names.insert(0, "prepare_data")
        for name in names:
            self._shadow(datamodule, name, f"[DataModule]{type(datamodule).__name__}.{name}")

    def _wrap_hooks(self) -> None:
        hooks = self.trainer._hooks
        for name, callables in hooks.callback_hooks.items():
            if callables:
                original = list(callables)
                callables[:] = [self._timed(f"{_owner(fn)}.{name}", fn) for fn in original]
                self._hook_lists.append((callables, original))
        self._module_hooks = dict(hooks.module_hooks)
        for name, fn in self._module_hooks.items():
            hooks.module_hooks[name] = self._timed(f"{_owner(fn)}.{name}", fn)

    def _data_wait(self, iterator: Iterator[Any]) -> Iterator[Any]:
        start, stop, step = self.profiler.start, self.profiler.stop, self.profiler.step
        while True:
            step()
            start(DATA_WAIT)
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                stop(DATA_WAIT)
            yield batch

    def remove(self) -> None:
        """Put back every wrapped call."""
        for owner, name in reversed(self._shadowed):
            owner.__dict__.pop(name, None)
        self._shadowed.clear()
        for callables, original in self._hook_lists:
            callables[:] = original
        self._hook_lists.clear()
        hooks = self.trainer._hooks
        if hooks is not None:
            hooks.module_hooks.update(self._module_hooks)
        wrappers = self.trainer.train_iterator_wrappers
        if self._data_wait in wrappers:
            wrappers.remove(self._data_wait)


def _owner(fn: Any) -> str:
    owner = getattr(fn, "__self__", None)
    return type(owner).__name__ if owner is not None else getattr(fn, "__qualname__", "hook").split(".")[0]
