"""A stage run in spawned processes (``ddp_spawn``): what rank 0 sends back, and how the caller adopts it.

The caller's Trainer and module did not run the stage, so after it they take over rank 0's final state:
the module's weights, the loop progress, the metrics and the callbacks' state (e.g. a checkpoint
callback's best path), and the stage's return value.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from trainer.module.train_module import TrainModule


class SpawnHost(Protocol):
    """What a spawned stage reads and sets on the Trainer (:class:`trainer.trainer.Trainer` is one; it imports this
    module, so it is described here rather than imported)."""

    module: Any  # the TrainModule, or None before a stage
    fit_loop: Any  # trainer.loops.fit_loop.FitLoop: its progress
    callbacks: list[Any]
    _metrics: Any  # trainer.metrics.connector.MetricsConnector: callback_metrics, logged_metrics

    @property
    def is_global_zero(self) -> bool: ...


def _to_cpu(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in values.items()}


def run_and_pack(trainer: SpawnHost, fn: Callable[..., Any], args: tuple) -> Any:
    """Run the stage on this rank; global rank 0 returns its result with the state the caller adopts."""
    result = fn(*args)
    if not trainer.is_global_zero:
        return None
    return {
        "result": result,
        "state_dict": _to_cpu(trainer.module.state_dict()) if trainer.module is not None else None,
        "progress": trainer.fit_loop.progress.state_dict(),
        "callback_metrics": _to_cpu(trainer._metrics.callback_metrics),
        "logged_metrics": _to_cpu(trainer._metrics.logged_metrics),
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks},
        "state": (trainer._state_fn, trainer._status),  # trainer.state's entry point and status
    }


def run_spawned(trainer: SpawnHost, launcher: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` through a launcher whose processes are new, then adopt rank 0's state here."""
    model = next((arg for arg in args if isinstance(arg, TrainModule)), None)
    try:
        packed = launcher.launch(run_and_pack, trainer, fn, args)
    except BaseException:
        from trainer.states import TrainerStatus

        trainer._status = TrainerStatus.INTERRUPTED
        raise
    if packed is None:
        return None
    trainer._state_fn, trainer._status = packed["state"]
    if model is not None and packed["state_dict"] is not None:
        model.load_state_dict(packed["state_dict"])
        model.trainer = trainer
        trainer.module = model
    trainer.fit_loop.progress.load_state_dict(packed["progress"])
    trainer._metrics.callback_metrics.update(packed["callback_metrics"])
    trainer._metrics.logged_metrics.update(packed["logged_metrics"])
    for callback in trainer.callbacks:
        state = packed["callbacks"].get(callback.state_key)
        if state:
            callback.load_state_dict(state)
    return packed["result"]
