"""What the loops need of the Trainer, as an interface: the loops are handed an object with these members (the
:class:`~trainer.trainer.Trainer` is one) and import nothing of the Trainer itself.

The members are the Trainer's settings the loops read, the parts it is composed of (strategy, module, fault
monitor, checkpoint and metrics connectors, hook dispatcher) and the few set-up steps the loops ask it for
(the training iterator of an epoch, a validation run inside fit, reloading dataloaders).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Optional, Protocol, Union

if TYPE_CHECKING:  # pragma: no cover
    from trainer.strategies.strategy import Strategy
    from trainer.loops.optimizers import SchedulerConfig
    from trainer.metrics.logged_metrics import ResultCollection


class LoopHost(Protocol):
    """The Trainer as the loops see it."""

    # settings
    max_epochs: Optional[int]
    max_steps: int
    accumulate_grad_batches: int
    gradient_clip_val: Optional[float]
    gradient_clip_algorithm: Optional[str]
    log_every_n_steps: int
    val_check_interval: Any  # int, float, or a time-based duration (str, timedelta, dict)
    _val_check_seconds: Optional[float]  # the time-based val_check_interval in seconds, else None
    _last_val_time: float  # time.monotonic() when the last evaluation ended (time-based val_check_interval only)
    check_val_every_n_epoch: Optional[int]
    inference_mode: bool
    reload_dataloaders_every_n_epochs: int
    # parts and state
    strategy: "Strategy"
    module: Any  # the TrainModule being run
    fit_loop: Any  # trainer.loops.fit_loop.FitLoop (not imported: it imports this module)
    should_stop: bool
    num_training_batches: float
    lr_scheduler_configs: list["SchedulerConfig"]
    _results: Optional["ResultCollection"]  # the running stage's logged values
    _hooks: Any  # trainer.hooks.HookDispatcher of the stage
    _metrics: Any  # trainer.metrics.connector.MetricsConnector
    _faults: Any  # trainer.faults.monitor.FaultMonitor
    _checkpoint: Any  # trainer.checkpoint.connector.CheckpointConnector
    _val_enabled: bool

    @property
    def current_epoch(self) -> int: ...

    @property
    def callback_metrics(self) -> dict[str, Any]: ...

    def _call_hook(self, name: str, *args: Any) -> Any: ...

    def _can_stop(self, epochs_done: int) -> bool: ...

    def _train_iterator(self, epoch: int, start_batch: int) -> Iterator[Any]: ...

    def _run_validation_in_fit(self) -> None: ...

    def _reload_fit_dataloaders(self) -> None: ...

    def _training_data(self) -> Any: ...
