"""``EarlyStopping``: stop ``fit`` when a monitored metric stops improving, crosses a threshold or diverges."""
from __future__ import annotations

import math
from enum import Enum
from typing import Any, Optional

from trainer.callbacks.callback import Callback
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_info, rank_zero_warn


class MonitorNotLoggedError(ConfigurationError, RuntimeError):
    """``EarlyStopping(strict=True)`` found no logged value of its ``monitor`` (a ``RuntimeError`` as in
    Lightning, and a ``ConfigurationError`` as our other refusals)."""


class EarlyStoppingReason(Enum):
    """Why :class:`EarlyStopping` stopped the fit (``early_stopping.stopping_reason``), as Lightning names it."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Ask the Trainer to stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience``
    checks, reached ``stopping_threshold``, went past ``divergence_threshold`` or became NaN/inf.

    It checks after each validation (or at the end of each training epoch when validation runs there or the
    metric is a training one: ``check_on_train_epoch_end``). Under several processes the ranks decide
    together (any rank's "stop" stops all), so they leave the loop at the same step. The Trainer honours the
    request once ``min_epochs`` is reached. ``wait_count``, ``best_score`` and ``stopped_epoch`` are saved in
    checkpoints. Why it stopped: :attr:`stopping_reason` (an :class:`EarlyStoppingReason`) and
    :attr:`stopping_reason_message` (a sentence).
    """

    mode_dict = {"min": "<", "max": ">"}

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: Optional[float] = None,
        divergence_threshold: Optional[float] = None,
        check_on_train_epoch_end: Optional[bool] = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        if mode not in self.mode_dict:
            raise ConfigurationError(f"EarlyStopping(mode={mode!r}) is not valid: `mode` can be min, max, got {mode}.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ConfigurationError(f"EarlyStopping(patience={patience!r}) must be an int >= 0.")
        self.monitor = monitor
        self.min_delta = abs(float(min_delta))
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = log_rank_zero_only  # Lightning's; messages are printed on global rank 0 anyway
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: Optional[str] = None
        self._last_reason = EarlyStoppingReason.NOT_STOPPED  # the kind of the latest evaluate() that said "stop"

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if self._check_on_train_epoch_end is None:
            interval = trainer.val_check_interval
            self._check_on_train_epoch_end = (interval is None or interval == 1.0) and trainer.check_val_every_n_epoch == 1

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self._check_on_train_epoch_end and not self._skip(trainer):
            self._run_check(trainer)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if not self._check_on_train_epoch_end and not self._skip(trainer):
            self._run_check(trainer)

    def _skip(self, trainer: Any) -> bool:
        return trainer.state_stage != "fit" or trainer.sanity_checking or bool(trainer.fast_dev_run)

    # ------------------------------------------------------------------ decision
    def _run_check(self, trainer: Any) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            message = (
                f"Early stopping conditioned on metric `{self.monitor}` which is not available: "
                f"EarlyStopping(monitor={self.monitor!r}) found no metric {self.monitor!r} among the logged ones "
                f"{sorted(trainer.callback_metrics)}. Log it with self.log({self.monitor!r}, value)"
            )
            if self.strict:
                raise MonitorNotLoggedError(message + ", or pass strict=False to skip checks until it is logged.")
            if self.verbose:  # as Lightning: a non-strict check without the metric is silent unless verbose
                rank_zero_warn(message + "; this check is skipped.", category=RuntimeWarning)
            return
        should_stop, reason = self.evaluate(float(value))
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        if should_stop:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = self._last_reason
            self.stopping_reason_message = reason or "another process asked to stop"
        if reason and (self.verbose or should_stop):
            rank_zero_info("EarlyStopping: %s", reason)

    def evaluate(self, current: float) -> tuple[bool, Optional[str]]:
        """Update the state with a new value of the metric; returns (stop?, why)."""
        name = self.monitor
        reasons = EarlyStoppingReason
        self._last_reason = reasons.NOT_STOPPED  # another rank's "stop" keeps this kind
        if self.check_finite and not math.isfinite(current):
            self._last_reason = reasons.NON_FINITE_METRIC
            return True, f"{name} = {current} is not finite; the best value was {self.best_score:.6g}. Stopping."
        if self.stopping_threshold is not None and self._better(current, self.stopping_threshold):
            self._last_reason = reasons.STOPPING_THRESHOLD
            return True, (f"Stopping threshold reached: {name} = {current:.6g} "
                          f"{self.mode_dict[self.mode]} {self.stopping_threshold}. Stopping.")  # fmt: skip
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, current):
            self._last_reason = reasons.DIVERGENCE_THRESHOLD
            return True, (f"Divergence threshold reached: {name} = {current:.6g} is past "
                          f"{self.divergence_threshold}. Stopping.")  # fmt: skip
        improvement = current + self.min_delta if self.mode == "min" else current - self.min_delta
        if self._better(improvement, self.best_score):
            previous, self.best_score = self.best_score, current
            self.wait_count = 0
            if math.isfinite(previous):
                return False, f"{name} improved by {abs(previous - current):.6g} to {current:.6g}."
            return False, f"{name} = {current:.6g} (first value)."
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self._last_reason = reasons.PATIENCE_EXHAUSTED
            return True, (f"{name} did not improve by more than {self.min_delta} in the last {self.wait_count} "
                          f"checks; the best value was {self.best_score:.6g}. Stopping.")  # fmt: skip
        return False, None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """What a resumed fit needs to keep counting patience."""
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch,
                "best_score": float(self.best_score), "patience": self.patience,
                "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.wait_count = state_dict.get("wait_count", 0)
        self.stopped_epoch = state_dict.get("stopped_epoch", 0)
        self.best_score = float(state_dict.get("best_score", self.best_score))
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")
