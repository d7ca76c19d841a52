"""Fault handling during a fit: stop signals and non-finite losses, acted on by all ranks at the same step.

The training loop calls :meth:`FaultMonitor.check` after an optimizer step only when
``global_step >= due_step`` (one integer comparison per batch). With one process ``due_step`` is far away
until a signal arrives (the handler pulls it to 0) or the non-finite buffer wants reading. With several
processes the ranks must agree, so every rank checks at the same steps: the interval is chosen from the
measured step time so that the one small collective (a max-reduce of [signal, interval, -bad step]) runs
about every ``target_seconds``, whatever the step time, and never more than once per step.

With several processes the first check also tells the strategy that training runs (it shortens the
process-group timeout, :mod:`trainer.strategies.launch.hang_report`), and a collective that times out during the fit becomes a
:class:`~trainer.strategies.errors.HangError` naming the ranks that stopped answering and the step.
"""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Iterator, Optional

import torch

from trainer.strategies.errors import ConfigurationError, HangError
from trainer.strategies.launch.hang_report import collective_timed_out
from trainer.strategies.rank import rank_zero_warn
from trainer.faults.nonfinite import NONFINITE_MODES, BadLoss, NonFiniteGuard, NonFiniteLossError
from trainer.faults.signals import DEFAULT_STOP_SIGNALS, SignalConnector, parse_signals


_NEVER = sys.maxsize
_NO_BAD_STEP = -(2**62)


class FaultMonitor:
    """Owns the signal connector and the non-finite guard of one Trainer."""

    target_seconds = 2.0
    max_interval = 100

    def __init__(self, trainer: Any, stop_signals: Any = DEFAULT_STOP_SIGNALS,
                 on_nonfinite_loss: Optional[str] = None) -> None:  # fmt: skip
        self.trainer = trainer
        self.signals = SignalConnector(parse_signals(stop_signals))
        self.signals.on_receive = self._on_signal
        if on_nonfinite_loss is not None and on_nonfinite_loss not in NONFINITE_MODES:
            raise ConfigurationError(
                f"on_nonfinite_loss={on_nonfinite_loss!r} is not valid. Use 'stop' (end the fit with the last good "
                "weights and raise NonFiniteLossError naming the step and the last good checkpoint), 'warn' (the "
                "same stop, but fit() returns after a warning), 'skip' (drop such batches), 'raise' (raise at once, "
                "weights as they are) or 'ignore'; None picks 'stop', or 'ignore' under 16-mixed where the gradient "
                "scaler already skips those steps."
            )
        if on_nonfinite_loss is None:
            on_nonfinite_loss = "ignore" if getattr(trainer.strategy.precision, "scaler", None) is not None else "stop"
        self.mode = on_nonfinite_loss
        progress = trainer.fit_loop.progress
        self.guard: Optional[NonFiniteGuard] = None if self.mode == "ignore" else NonFiniteGuard(self.mode, progress)
        self.due_step = _NEVER
        self.status = "success"
        self._active = False
        self._periodic = False  # whether checks run on a schedule (buffer to read, or ranks to agree with)
        self._last_time = 0.0
        self._last_step = 0
        self._started = False  # the first check of this fit (after its first optimizer step) has run
        self._exact = False  # a non-finite loss stopped the fit before its backward (weights of the last good step)

    # ------------------------------------------------------------------ fit scope
    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Handle signals and non-finite losses for the duration of a fit."""
        trainer = self.trainer
        self.status = "success"
        self._active = True
        distributed = trainer.world_size > 1
        if self.guard is not None:
            self.guard.reset()
            self.guard.zero_loss = _zero_loss(trainer.module) if distributed else None
            self.guard.read_as_it_comes(trainer.strategy.root_device.type == "cpu")
            # One process stops before the bad loss's backward (its weights stay good); ranks stop at agreed steps.
            self.guard.on_found = None if distributed else self._stop_now
        self._last_time = time.monotonic()
        self._last_step = trainer.fit_loop.progress.global_step
        self._periodic = self.guard is not None or (distributed and bool(self.signals.actions))
        self._started = False
        self._exact = False
        self.due_step = self._last_step + 1 if self._periodic or distributed else _NEVER
        self.signals.install()
        try:
            yield
        except NonFiniteLossError as err:
            self.status = "failed"
            trainer.interrupted = True
            if self.mode == "raise":
                raise
            stopped = self._stop_with_good_weights(err)
            if self.mode == "stop":
                raise stopped from None
            rank_zero_warn(f"Training stopped. {stopped} fit() returns (on_nonfinite_loss='warn').")
        except RuntimeError as err:
            if distributed and not isinstance(err, HangError) and collective_timed_out(err):
                self.status = "failed"
                raise HangError(self._hang_message(err)) from err
            raise
        finally:
            self.signals.uninstall()
            self._active = False
            self.due_step = _NEVER

    def _check_after_this_step(self) -> None:
        self.due_step = 0

    def _stop_now(self) -> None:
        """A loss read as it comes was non-finite (one process): raise before its backward changes the weights."""
        if self.mode == "raise":  # 'raise' keeps its meaning: the weights as they are, after the bad step
            self._check_after_this_step()
            return
        bad = self.guard.found
        self._exact = True
        raise NonFiniteLossError(self._message(bad), bad.global_step, self.trainer._checkpoint.last_saved_path)

    def _stop_with_good_weights(self, err: NonFiniteLossError) -> NonFiniteLossError:
        """The error ``fit()`` raises (or warns with): where the loss went bad, and which weights are in memory.

        Stopped before the bad loss's backward (one process reading losses as they come), the weights are those of
        the last good step, at no cost. Found later (at a check point: an accelerator, several ranks), the bad steps
        may have changed the weights, so those of the last checkpoint saved before the bad step are loaded (every
        rank, at the same agreed check point); without one, the message says the weights may be non-finite. Keeping
        a copy of the weights at every check point would cost a model's memory: this is the documented choice."""
        trainer = self.trainer
        last = trainer._checkpoint.last_saved_path
        step = getattr(err, "global_step", None)
        trainer.module.zero_grad(set_to_none=True)  # a partial window's (or non-finite) gradients: not for later
        if self._exact:
            weights = (f"The weights in memory are those of global step {step}, the last good one (the bad loss's "
                       "backward did not run).")  # fmt: skip
        elif last:
            trainer._checkpoint.reload_weights(last)
            weights = "The weights in memory were reloaded from that checkpoint, the last saved before the bad step."
        else:
            weights = (f"The weights in memory are those at global step {trainer.global_step} and may hold NaN/inf "
                       "values: save checkpoints (ModelCheckpoint(every_n_train_steps=...)) to have good ones put back.")
        return NonFiniteLossError(f"{err} {weights}", step, last)

    def _on_signal(self, signum: int) -> None:
        if self.trainer.world_size == 1:  # several ranks wait for the agreed step
            self._check_after_this_step()

    # ------------------------------------------------------------------ check points
    def check(self) -> None:
        """At an optimizer-step boundary: agree with the other ranks on signals and non-finite losses, then act."""
        trainer = self.trainer
        step = trainer.fit_loop.progress.global_step
        trainer._checkpoint.raise_write_error()  # a background checkpoint write that failed
        if not self._started:
            self._started = True
            trainer.strategy.after_first_step()
        signum = self.signals.received or 0
        bad = self.guard.flush() if self.guard is not None else None
        interval = self._interval(step)
        if trainer.world_size > 1:
            signum, interval, bad = self._agree(signum, interval, bad)
        self.due_step = step + interval if self._periodic else _NEVER
        if bad is not None:
            raise NonFiniteLossError(self._message(bad), bad.global_step, trainer._checkpoint.last_saved_path)
        if signum:
            self.signals.act(trainer, signum)

    def before_save(self) -> None:
        """Refuse to save a checkpoint when a non-finite loss was recorded since the last check (all ranks call it)."""
        if not self._active or self.guard is None:
            return
        bad = self.guard.flush()
        if self.trainer.world_size > 1:
            _, _, bad = self._agree(0, 1, bad)
        if bad is not None:
            raise NonFiniteLossError(self._message(bad), bad.global_step, self.trainer._checkpoint.last_saved_path)

    def _interval(self, step: int) -> int:
        now = time.monotonic()
        steps, elapsed = step - self._last_step, now - self._last_time
        self._last_time, self._last_step = now, step
        if steps <= 0 or elapsed <= 0:
            return 1
        return max(1, min(self.max_interval, int(self.target_seconds * steps / elapsed)))

    def _agree(self, signum: int, interval: int, bad: Optional[BadLoss]) -> tuple[int, int, Optional[BadLoss]]:
        strategy = self.trainer.strategy
        local_bad = -bad.global_step if bad is not None else _NO_BAD_STEP
        flags = torch.tensor([signum, interval, local_bad], dtype=torch.int64, device=strategy.root_device)
        signum, interval, worst = (int(v) for v in strategy.reduce(flags, op="max").tolist())
        if bad is None and worst != _NO_BAD_STEP:
            bad = BadLoss(float("nan"), -worst)
        elif bad is not None and -worst < bad.global_step:
            bad = BadLoss(float("nan"), -worst)  # another rank saw one earlier
        return signum, interval, bad

    def _hang_message(self, err: BaseException) -> str:
        trainer = self.trainer
        progress = trainer.fit_loop.progress
        where = f"global step {progress.global_step} (epoch {progress.epoch}, batch {progress.batch_in_epoch})"
        ranks = trainer.strategy.unresponsive_ranks()
        if ranks:
            who = f"rank {ranks[0]} stopped answering" if len(ranks) == 1 else \
                f"ranks {', '.join(map(str, ranks))} stopped answering"  # fmt: skip
        elif ranks == []:
            who = "every rank answered afterwards: one was busier than the timeout allows"
        else:
            who = "rank 0 did not answer (it is stuck, or its own report names the rank that stopped)"
        detail = str(err).strip().splitlines()[0][:200]
        return (f"The job hung after {where}: {who}. A collective on rank {trainer.global_rank} gave up waiting "
                f"({detail}). See the named rank's stack with `py-spy dump --pid PID`; a rank that is legitimately "
                "busy that long (work done on one rank only) needs a longer DDPStrategy(train_timeout=...).")

    def _message(self, bad: BadLoss) -> str:
        last = self.trainer._checkpoint.last_saved_path
        text = f"The training loss was {bad.value} at {bad.where()}; no checkpoint was saved after it."
        if last:
            text += (f" The last checkpoint saved before it is '{last}': resume from it with fit(ckpt_path='{last}'), "
                     "perhaps with a lower learning rate or gradient clipping.")  # fmt: skip
        else:
            text += " No checkpoint was saved before it in this fit."
        return text + (" Trainer(on_nonfinite_loss='skip') drops such batches instead; 'warn' stops the same way but "
                       "fit() returns after a warning.")


def _zero_loss(module: Any) -> Any:
    params = [p for p in module.parameters() if p.requires_grad]

    def zero() -> torch.Tensor:
        # Every rank must run a backward that reaches every parameter, or the gradient all-reduce hangs.
        return torch.stack([p.sum() for p in params]).sum() * 0.0

    return zero
