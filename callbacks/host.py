"""What callbacks use of the Trainer, written down: the one surface between ``callbacks/`` and ``trainer/``.

- :class:`CallbackHost`: the Trainer as a callback's hooks see it (the ``trainer`` argument). The
  :class:`~trainer.trainer.Trainer` is one; a callback reads and sets only these members.
- Four helpers of the Trainer's machinery that callbacks need to act like a loop (run training steps, replace a
  scheduler, leave the random streams as they were). This module is the only file in ``callbacks/`` that imports
  from ``trainer/``; a callback imports them from here, so a move inside ``trainer/`` changes this file alone
  (``tests/test_layering.py`` checks it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, Union

from trainer.data.combined_loader import training_batches
from trainer.loops.optimizers import SchedulerConfig
from trainer.loops.step_signature import takes_batch_idx, takes_dataloader_iter
from trainer.reproducibility.seed import isolated_rng

if TYPE_CHECKING:  # pragma: no cover
    import os

    from torch.optim import Optimizer

    from trainer.strategies.strategy import Strategy

__all__ = ["CallbackHost", "SchedulerConfig", "isolated_rng", "takes_batch_idx", "takes_dataloader_iter",
           "training_batches"]


class CallbackHost(Protocol):
    """The Trainer as callbacks see it: what the built-in callbacks read, set (``should_stop``,
    ``accumulate_grad_batches``, ``lr_scheduler_configs``) and call."""

    # settings
    max_epochs: Optional[int]
    val_check_interval: Optional[Union[int, float]]
    check_val_every_n_epoch: Optional[int]
    log_every_n_steps: int
    num_sanity_val_steps: int
    fast_dev_run: Union[int, bool]
    precision: str
    # parts and state (set by callbacks: should_stop, accumulate_grad_batches, lr_scheduler_configs)
    strategy: "Strategy"
    callbacks: list[Any]
    loggers: list[Any]
    datamodule: Any
    fit_loop: Any  # its ``progress`` (epoch_finished, counters)
    should_stop: bool
    accumulate_grad_batches: int
    lr_scheduler_configs: list[SchedulerConfig]
    train_iterator_wrappers: list[Callable[[Iterator[Any]], Iterator[Any]]]
    state_stage: Optional[str]
    sanity_checking: bool
    ckpt_path: Optional[str]
    num_training_batches: float
    _results: Any  # where self.log writes; the finders' throw-away evaluation steps set None, so their logs are dropped
    _checkpoint: Any  # its after_commit(action): ModelCheckpoint deletes a replaced file once the new one is complete

    @property
    def global_step(self) -> int: ...

    @property
    def current_epoch(self) -> int: ...

    @property
    def skipped_steps(self) -> int: ...

    @property
    def optimizers(self) -> list["Optimizer"]: ...

    @property
    def world_size(self) -> int: ...

    @property
    def is_global_zero(self) -> bool: ...

    @property
    def predicting(self) -> bool: ...

    @property
    def log_dir(self) -> str: ...

    @property
    def callback_metrics(self) -> dict[str, Any]: ...

    @property
    def progress_bar_metrics(self) -> dict[str, float]: ...

    @property
    def checkpoint_callback(self) -> Any: ...

    @property
    def train_dataloader(self) -> Any: ...

    @property
    def predict_dataloaders(self) -> Any: ...

    @property
    def num_val_batches(self) -> list[float]: ...

    @property
    def val_dataloaders(self) -> Any: ...

    @property
    def test_dataloaders(self) -> Any: ...

    @property
    def predict_dataloaders(self) -> Any: ...

    @property
    def state(self) -> Any: ...

    def save_checkpoint(self, filepath: Union[str, "os.PathLike[str]"], weights_only: bool = False,
                        asynchronous: bool = False) -> None: ...  # fmt: skip

    def reset_train_dataloader(self, loader: Any) -> None: ...

    def reset_val_dataloader(self) -> None: ...

    def reset_eval_dataloader(self, loader: Any) -> None: ...
