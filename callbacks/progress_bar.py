"""``ProgressBar``: the base of progress bars (Lightning's), with the members a bar's author overrides or reads.

A callback deriving from it is *the* progress bar: ``trainer.progress_bar_callback`` returns it and the default
bar is not added. ``get_metrics(trainer, pl_module)`` is what a bar shows (override it to drop or add items);
the ``total_*`` properties and ``*_description`` names are what a custom bar draws with.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional, Union

from trainer.callbacks.callback import Callback


class ProgressBar(Callback):
    """Base class of progress bars. Subclasses implement ``disable``/``enable`` and draw in the hooks they need;
    ``setup`` disables the bar on every process but global rank 0."""

    def __init__(self) -> None:
        self._trainer: Any = None
        self._current_eval_dataloader_idx: Optional[int] = None

    @property
    def trainer(self) -> Any:
        """The Trainer running this bar (set in ``setup``)."""
        if self._trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet: the bar is "
                            "attached to a Trainer in `setup`.")  # fmt: skip
        return self._trainer

    sanity_check_description = "Sanity Checking"
    train_description = "Training"
    validation_description = "Validation"
    test_description = "Testing"
    predict_description = "Predicting"

    @property
    def total_train_batches(self) -> Union[int, float]:
        """Training batches this epoch (``inf`` for an endless loader; capped by the steps left with
        ``max_epochs=-1`` and ``max_steps``)."""
        trainer = self.trainer
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)
        return trainer.num_training_batches

    @property
    def total_val_batches(self) -> Union[int, float]:
        """Validation batches of all validation dataloaders together; 0 in an epoch that ``check_val_every_n_epoch``
        leaves without validation (as Lightning's)."""
        trainer = self.trainer
        every_n = trainer.check_val_every_n_epoch
        if every_n is not None and not trainer.sanity_checking and (trainer.current_epoch + 1) % every_n:
            return 0
        return sum(trainer.num_val_batches)

    def _current(self, batches: list[float]) -> Union[int, float]:
        return batches[self._current_eval_dataloader_idx or 0] if batches else 0

    @property
    def total_val_batches_current_dataloader(self) -> Union[int, float]:
        """Validation (or sanity-check) batches of the dataloader now running."""
        trainer = self.trainer
        batches = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        return self._current(batches)

    @property
    def total_test_batches_current_dataloader(self) -> Union[int, float]:
        """Test batches of the dataloader now running."""
        return self._current(self.trainer.num_test_batches)

    @property
    def total_predict_batches_current_dataloader(self) -> Union[int, float]:
        """Prediction batches of the dataloader now running."""
        return self._current(self.trainer.num_predict_batches)

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Record ``dataloader_idx`` as the running one; whether it differs from the one before."""
        previous, self._current_eval_dataloader_idx = self._current_eval_dataloader_idx, dataloader_idx
        return previous != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        """Forget the running dataloader (at the start of an evaluation)."""
        self._current_eval_dataloader_idx = None

    def disable(self) -> None:
        """Stop drawing (called on processes other than global rank 0)."""
        raise NotImplementedError(f"{type(self).__name__} must implement `disable()`.")

    def enable(self) -> None:
        """Draw again after :meth:`disable`."""
        raise NotImplementedError(f"{type(self).__name__} must implement `enable()`.")

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print without breaking the bar."""
        print(*args, **kwargs)

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Union[int, str, float, dict[str, float]]]:
        """What the bar shows: ``v_num`` (the logger's version, its last 4 characters when a string) and then
        ``trainer.progress_bar_metrics``. Override it to change the items, e.g. ``items.pop("v_num", None)``."""
        standard = standard_metrics(trainer)
        shown = trainer.progress_bar_metrics
        clash = [key for key in standard if key in shown]
        if clash:
            warnings.warn(f"The progress bar already tracks a metric with the name(s) '{', '.join(clash)}' and "
                          f"`self.log('{clash[0]}', ..., prog_bar=True)` will overwrite this value. If this is "
                          "undesired, change the name or override `get_metrics()` in the progress bar callback.",
                          UserWarning, stacklevel=2)  # fmt: skip
        return {**standard, **shown}


def standard_metrics(trainer: Any) -> dict[str, Union[int, str]]:
    """``{"v_num": version}`` when the run has loggers with a version (several: their distinct versions joined
    by ``_``), else ``{}``."""
    versions: list[Any] = []
    for logger in getattr(trainer, "loggers", None) or []:
        version = getattr(logger, "version", None)
        if version not in versions:
            versions.append(version)
    if not versions:
        return {}
    version = versions[0] if len(versions) == 1 else "_".join(str(v) for v in versions)
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}
