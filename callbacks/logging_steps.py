"""``LoggingSteps``: lets a callback do its (cheap but not free) measuring only on the steps the Trainer logs."""
from __future__ import annotations

from typing import Any


class LoggingSteps:
    """Call :meth:`due` from ``on_train_batch_end``: True once per optimizer step that the Trainer is about
    to send to the loggers (every ``log_every_n_steps`` steps). Values a callback records then with
    ``module.log(..., on_step=True)`` reach the loggers at that same step."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = 0

    def due(self, trainer: Any) -> bool:
        """True on the first call after a logging step was reached."""
        step = trainer.global_step
        if step == self._last or step % trainer.log_every_n_steps:
            return False
        self._last = step
        return True
