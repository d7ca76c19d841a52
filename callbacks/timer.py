"""``Timer``: stop training cleanly after a wall-clock budget, saving a checkpoint to resume from."""
from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from typing import Any, Optional, Union

from trainer.callbacks.callback import Callback
from trainer.strategies.errors import ConfigurationError

_DHMS = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})$")
#: In multi-process runs the ranks agree on stopping (one broadcast) only every this many steps.
SYNC_EVERY_N_STEPS = 10


def parse_duration(duration: Union[str, float, int, timedelta, dict, None]) -> Optional[float]:
    """Seconds from ``"DD:HH:MM:SS"``, a ``timedelta``, ``dict(hours=1, minutes=30)`` or a number of seconds."""
    if duration is None:
        return None
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, dict):
        try:
            seconds = timedelta(**duration).total_seconds()
        except TypeError as err:
            message = f"Timer(duration={duration!r}): {err}. Use keys days/hours/minutes/seconds."
            raise ConfigurationError(message) from None
    elif isinstance(duration, str):
        match = _DHMS.match(duration.strip())
        if match is None:
            raise ConfigurationError(f"Timer(duration={duration!r}) must look like 'DD:HH:MM:SS', e.g. '00:12:00:00'.")
        days, hours, minutes, secs = map(int, match.groups())
        seconds = timedelta(days=days, hours=hours, minutes=minutes, seconds=secs).total_seconds()
    elif isinstance(duration, (int, float)) and not isinstance(duration, bool):
        seconds = float(duration)
    else:
        raise ConfigurationError(f"Timer(duration={duration!r}) must be 'DD:HH:MM:SS', a timedelta, a dict or seconds.")
    if seconds < 0:
        raise ConfigurationError(f"Timer(duration={duration!r}) must not be negative.")
    return seconds


class Timer(Callback):
    """Track time per stage and, with ``duration``, stop fit once that much training time has passed.

    ``Timer(duration="00:11:30:00")`` (or a ``timedelta``, ``dict(hours=11, minutes=30)``, seconds). The
    check runs after each optimizer step (``interval="step"``) or each epoch (``"epoch"``); when time is
    up it sets ``trainer.should_stop`` and, with ``save_checkpoint=True``, writes
    ``timer-epoch=E-step=S.ckpt`` into the ModelCheckpoint's ``dirpath`` (else ``<log_dir>/checkpoints``)
    so ``fit(ckpt_path="last")`` continues. Elapsed time is saved in checkpoints, so the budget spans
    resumed runs. In multi-process runs the ranks agree every ``SYNC_EVERY_N_STEPS`` steps.
    """

    def __init__(
        self,
        duration: Union[str, float, int, timedelta, dict, None] = None,
        interval: str = "step",
        save_checkpoint: bool = True,
        verbose: bool = True,
    ) -> None:
        if interval not in ("step", "epoch"):
            raise ConfigurationError(f"Timer(interval={interval!r}) must be 'step' or 'epoch'.")
        self.duration = parse_duration(duration)
        self.interval = interval
        self.save_checkpoint = save_checkpoint
        self.verbose = verbose
        self.checkpoint_path: Optional[str] = None
        self._start: dict[str, float] = {}
        self._end: dict[str, float] = {}
        self._offset = 0.0  # training time of the runs this one resumes
        self._last_step = -1

    # ------------------------------------------------------------------ queries
    def start_time(self, stage: str = "train") -> Optional[float]:
        """When ``stage`` last started (``time.monotonic()`` seconds), or ``None`` if it has not."""
        return self._start.get(stage)

    def end_time(self, stage: str = "train") -> Optional[float]:
        """When ``stage`` last ended (``time.monotonic()`` seconds), or ``None`` while it runs or before."""
        return self._end.get(stage)

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in ``stage`` ("train", "validate", "test"); training includes resumed runs."""
        start = self._start.get(stage)
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return offset + self._end.get(stage, time.monotonic()) - start

    def time_remaining(self, stage: str = "train") -> Optional[float]:
        """Seconds left of ``duration`` (``None`` without a duration)."""
        return None if self.duration is None else self.duration - self.time_elapsed(stage)

    # ------------------------------------------------------------------ stage timing
    def _begin(self, stage: str) -> None:
        self._start[stage] = time.monotonic()
        self._end.pop(stage, None)

    def _finish(self, stage: str) -> None:
        self._end[stage] = time.monotonic()

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self._begin("train")

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._finish("train")

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self._begin("validate")

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        self._finish("validate")

    def on_test_start(self, trainer: Any, module: Any) -> None:
        self._begin("test")

    def on_test_end(self, trainer: Any, module: Any) -> None:
        self._finish("test")

    # ------------------------------------------------------------------ stopping
    def on_fit_start(self, trainer: Any, module: Any) -> None:
        # After a resume the restored budget may already be spent (or duration=0): stop before the first step,
        # whatever the interval. Nothing new was trained, so there is nothing to save.
        if self.duration is not None:
            self._check(trainer, save=False)

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.interval != "step" or self.duration is None or step == self._last_step:
            return  # only after an optimizer step: stopping mid-accumulation would drop gradients
        self._last_step = step
        if trainer.world_size > 1 and step % SYNC_EVERY_N_STEPS:
            return
        self._check(trainer)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.interval == "epoch" and self.duration is not None:
            self._check(trainer)

    def _check(self, trainer: Any, save: bool = True) -> None:
        if trainer.should_stop and self.checkpoint_path is not None:
            return
        expired = self.time_elapsed() >= self.duration
        if trainer.world_size > 1:
            expired = bool(trainer.strategy.broadcast(expired))
        if not expired:
            return
        trainer.should_stop = True
        if self.verbose and trainer.is_global_zero:
            print(f"Timer: time is up after {timedelta(seconds=int(self.time_elapsed()))}; stopping at step "
                  f"{trainer.global_step}.")  # fmt: skip
        if save and self.save_checkpoint and self.checkpoint_path is None:
            callback = trainer.checkpoint_callback
            folder = getattr(callback, "dirpath", None) or os.path.join(trainer.log_dir, "checkpoints")
            path = os.path.join(str(folder), f"timer-epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt")
            if trainer.world_size > 1:
                path = trainer.strategy.broadcast(path)  # every rank must write to rank 0's path
            trainer.save_checkpoint(path)
            self.checkpoint_path = path

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Elapsed time per stage, so a resumed run continues the same budget."""
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in ("train", "validate", "test")}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Count the saved training time against the budget."""
        self._offset = float(state_dict.get("time_elapsed", {}).get("train", 0.0))
