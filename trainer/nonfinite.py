"""Non-finite training losses, detected without a host-device sync per step.

Each micro-batch's loss is copied into a slot of a small buffer on its own device (an asynchronous copy,
no allocation); the host reads the buffer only at the fault monitor's check points and before every
checkpoint save, which is where it learns the exact step. ``on_nonfinite_loss="skip"`` must decide before
the backward, so it reads every loss on the host: one sync per micro-batch, like a gradient scaler.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from strategies.rank import rank_zero_warn

if TYPE_CHECKING:  # pragma: no cover
    from trainer.loops.progress import Progress

NONFINITE_MODES = ("stop", "skip", "raise", "ignore")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (raised by ``Trainer(on_nonfinite_loss="raise")``)."""


@dataclass
class BadLoss:
    """Where the first non-finite loss was seen."""

    value: float
    global_step: int
    epoch: int = -1
    batch_idx: int = -1

    def where(self) -> str:
        """Human-readable position."""
        if self.epoch < 0:
            return f"global step {self.global_step} (on another rank)"
        return f"global step {self.global_step} (epoch {self.epoch}, batch {self.batch_idx})"


class NonFiniteGuard:
    """Called with every automatic-optimisation loss; returns the loss, or ``None`` to skip the micro-batch."""

    def __init__(self, mode: str, progress: "Progress") -> None:
        self.mode = mode
        self.progress = progress
        self.skipped = 0
        self.zero_loss: Any = None  # set under DDP: a zero loss touching every parameter replaces a skipped one
        self._buffer: Optional[Tensor] = None
        self._slots: list[Tensor] = []
        self._steps: list[int] = []
        self._epochs: list[int] = []
        self._batches: list[int] = []
        self._pos = 0
        self.found: Optional[BadLoss] = None

    def reset(self) -> None:
        """Forget what was recorded (a new fit starts)."""
        self._pos = 0
        self.found = None
        self.skipped = 0

    def __call__(self, loss: Tensor) -> Optional[Tensor]:
        if self.mode == "skip":
            return self._skip_if_bad(loss)
        pos = self._pos
        if pos == len(self._slots):
            self._grow(loss.device)
        self._slots[pos].copy_(loss.detach())
        progress = self.progress
        self._steps[pos] = progress.global_step
        self._epochs[pos] = progress.epoch
        self._batches[pos] = progress.batch_in_epoch
        self._pos = pos + 1
        return loss

    def _grow(self, device: torch.device) -> None:
        size = max(256, 2 * len(self._slots))
        buffer = torch.zeros(size, dtype=torch.float32, device=device)
        if self._buffer is not None and self._pos:
            buffer[: self._pos].copy_(self._buffer[: self._pos])
        extra = size - len(self._steps)
        for names in (self._steps, self._epochs, self._batches):
            names.extend([0] * extra)
        self._buffer = buffer
        self._slots = list(buffer.unbind())

    def flush(self) -> Optional[BadLoss]:
        """Read the losses recorded since the last flush (one sync); the first non-finite one, if any."""
        if self.found is not None or self._pos == 0:
            return self.found
        count, self._pos = self._pos, 0
        values = self._buffer[:count]
        if bool(torch.isfinite(values).all()):
            return None
        first = int(torch.nonzero(~torch.isfinite(values))[0, 0])
        self.found = BadLoss(float(values[first]), self._steps[first], self._epochs[first], self._batches[first])
        return self.found

    def _skip_if_bad(self, loss: Tensor) -> Optional[Tensor]:
        value = loss.detach()
        if bool(torch.isfinite(value)):
            return loss
        self.skipped += 1
        progress = self.progress
        if self.skipped <= 3 or self.skipped % 100 == 0:
            where = BadLoss(float(value), progress.global_step, progress.epoch, progress.batch_in_epoch).where()
            rank_zero_warn(
                f"Skipping a micro-batch whose loss is {float(value)} at {where} ({self.skipped} skipped so far; "
                "on_nonfinite_loss='skip')."
            )
        return self.zero_loss() if self.zero_loss is not None else None
