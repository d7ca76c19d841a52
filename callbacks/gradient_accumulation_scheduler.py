"""``GradientAccumulationScheduler``: change ``accumulate_grad_batches`` at chosen epochs."""
from __future__ import annotations

from typing import Any

from trainer.callbacks.callback import Callback
from trainer.strategies.errors import ConfigurationError


class GradientAccumulationScheduler(Callback):
    """``GradientAccumulationScheduler({0: 1, 4: 2, 8: 4})``: accumulate 1 batch in epochs 0-3, 2 in 4-7,
    4 from epoch 8 on. Epochs before the first key use 1. The factor is set at each epoch start, so a
    resumed run uses the factor of the epoch it resumes in (nothing to save)."""

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not isinstance(scheduling, dict) or not scheduling:
            raise ConfigurationError(
                f"GradientAccumulationScheduler(scheduling={scheduling!r}) needs a non-empty dict {{epoch: factor}}."
            )
        for epoch, factor in scheduling.items():
            if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
                raise ConfigurationError(f"GradientAccumulationScheduler: epoch key {epoch!r} must be an int >= 0.")
            if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
                raise ConfigurationError(
                    f"GradientAccumulationScheduler: factor {factor!r} for epoch {epoch} must be an int >= 1."
                )
        self.scheduling = dict(sorted(scheduling.items()))
        self._set: int = 1  # the factor this callback last put on the trainer

    def factor_for(self, epoch: int) -> int:
        """The accumulation factor in force at ``epoch``."""
        factor = 1
        for start, value in self.scheduling.items():
            if start <= epoch:
                factor = value
        return factor

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if not module.automatic_optimization:
            raise ConfigurationError(
                "GradientAccumulationScheduler works with automatic optimisation only; in manual optimisation "
                "accumulate in training_step yourself."
            )
        if trainer.accumulate_grad_batches not in (1, self._set):
            raise ConfigurationError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) and a "
                "GradientAccumulationScheduler were both given; set the factors in the scheduler only."
            )

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        self._set = self.factor_for(trainer.current_epoch)
        trainer.accumulate_grad_batches = self._set
