"""Non-finite training losses, detected without a host-device sync per step.

On an accelerator each micro-batch's loss is kept as a detached reference (every 256 of them are stacked into one
device tensor: one small kernel, no sync); the host reads the buffer only at the fault monitor's check points and
before every checkpoint save, which is where it learns the exact step. On the CPU there is no device to wait for:
each loss is read as it comes (cheaper than holding it), and a single process stops before that loss's backward,
so the weights in memory stay those of the last good step.
``on_nonfinite_loss="skip"`` must decide before the backward, so it reads every loss on the host: one sync per
micro-batch, like a gradient scaler.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import isfinite
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import Tensor

from trainer.strategies.rank import rank_zero_warn

if TYPE_CHECKING:  # pragma: no cover
    from trainer.loops.progress import Progress

NONFINITE_MODES = ("stop", "warn", "skip", "raise", "ignore")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite: ``fit()`` raises it under ``on_nonfinite_loss="stop"`` (the
    default, after putting back the weights of the last good step or checkpoint) and ``"raise"`` (at once).

    ``global_step``: the optimizer steps completed before the bad loss; ``checkpoint_path``: the last checkpoint
    saved before it in this fit (``None`` if there is none)."""

    def __init__(self, message: str, global_step: Optional[int] = None, checkpoint_path: Optional[str] = None) -> None:
        super().__init__(message)
        self.global_step = global_step
        self.checkpoint_path = checkpoint_path


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
    """Its :attr:`check` is called with every automatic-optimisation loss; it returns the loss, or ``None`` to skip
    the micro-batch."""

    _CHUNK = 256  # losses stacked into one device tensor at a time

    def __init__(self, mode: str, progress: "Progress") -> None:
        self.mode = mode
        self.progress = progress
        self.skipped = 0
        self.zero_loss: Any = None  # set under DDP: a zero loss touching every parameter replaces a skipped one
        # (detached loss, global_step, epoch, batch) of each loss not yet stacked: no copy, no sync per step
        self._pending: list[tuple[Tensor, int, int, int]] = []
        self._chunks: list[Tensor] = []  # the stacked losses, and where each was seen
        self._where: list[tuple[int, int, int]] = []
        self.found: Optional[BadLoss] = None
        #: What the loop calls with each loss: records it, or (mode "skip") reads it and decides.
        self.check = self._skip_if_bad if mode == "skip" else self._record
        #: Called when a loss read as it comes is non-finite: the monitor checks after this step, or (one process)
        #: raises at once, before the loss's backward.
        self.on_found: Optional[Callable[[], None]] = None

    def read_as_it_comes(self, on_host: bool) -> None:
        """``on_host``: the losses are on the CPU, so read each one at once instead of holding it until a check."""
        if self.mode != "skip":
            self.check = self._read_now if on_host else self._record

    def reset(self) -> None:
        """Forget what was recorded (a new fit starts)."""
        self._pending.clear()
        self._where.clear()
        self._chunks.clear()
        self.found = None
        self.skipped = 0

    def _record(self, loss: Tensor) -> Tensor:
        progress = self.progress
        pending = self._pending
        pending.append((loss.detach(), progress.global_step, progress.epoch, progress.batch_in_epoch))
        if len(pending) == self._CHUNK:  # bound what is held: one small kernel per 256 losses
            self._stack_pending()
        return loss

    def _read_now(self, loss: Tensor) -> Tensor:
        value = loss.item()
        if not isfinite(value) and self.found is None:
            progress = self.progress
            self.found = BadLoss(value, progress.global_step, progress.epoch, progress.batch_in_epoch)
            if self.on_found is not None:
                self.on_found()
        return loss

    def _stack_pending(self) -> None:
        losses, steps, epochs, batches = zip(*self._pending)
        self._chunks.append(torch.stack(losses).float())
        self._where.extend(zip(steps, epochs, batches))
        self._pending.clear()

    def flush(self) -> Optional[BadLoss]:
        """Read the losses recorded since the last flush (one sync); the first non-finite one, if any."""
        if self.found is not None or not (self._pending or self._where):
            return self.found
        if self._pending:
            self._stack_pending()
        values = torch.cat(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        where = self._where[:]
        self._chunks.clear()
        self._where.clear()
        finite = torch.isfinite(values)
        if bool(finite.all()):
            return None
        first = int(torch.nonzero(~finite)[0, 0])
        self.found = BadLoss(float(values[first]), *where[first])
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
