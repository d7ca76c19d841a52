"""Signals during a fit: record them in the handler, act on them later at a step boundary.

A handler only records the signal (and calls the handler that was installed before, if it is a Python
function), so a signal never interrupts an optimizer step or a checkpoint write half-way. The fault
monitor (:mod:`trainer.faults.monitor`) asks :class:`SignalConnector` what was received at step boundaries, agrees
with the other ranks, and runs the signal's *action* on every rank at the same step. Actions are
pluggable: :meth:`SignalConnector.register` replaces the action of a signal (e.g. "save, requeue the
SLURM job, exit").

Default actions: SIGINT (Ctrl-C) saves a checkpoint and raises ``KeyboardInterrupt`` (a second Ctrl-C
interrupts at once; during a checkpoint write it stops the process at once, status 130); every other stop signal saves a checkpoint and exits the process with status 0.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable, Iterable, Optional, Union

from trainer.strategies.checkpoint.atomic_write import writing_checkpoint
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_info, rank_zero_warn


SignalAction = Callable[[Any, int], None]
DEFAULT_STOP_SIGNALS = ("SIGTERM", "SIGINT")


def parse_signals(value: Union[None, str, int, Iterable[Union[str, int]]]) -> tuple[signal.Signals, ...]:
    """``"SIGTERM"``, ``"TERM"``, ``15``, ``signal.SIGUSR1`` or a list of them (``None``/``()``: none)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, (str, int)) else list(value)
    parsed = []
    for item in items:
        try:
            if isinstance(item, str):
                name = item.upper()
                parsed.append(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
            else:
                parsed.append(signal.Signals(item))
        except (KeyError, ValueError):
            raise ConfigurationError(
                f"stop_signals: {item!r} is not a signal on this platform. Use names such as 'SIGTERM', 'SIGUSR1' "
                "or 'SIGINT', or signal.Signals values."
            ) from None
    uncatchable = [s.name for s in parsed if s in (getattr(signal, "SIGKILL", None), getattr(signal, "SIGSTOP", None))]
    if uncatchable:
        raise ConfigurationError(f"stop_signals: {uncatchable} cannot be caught by any process.")
    return tuple(dict.fromkeys(parsed))


def checkpoint_and_exit(trainer: Any, signum: int) -> None:
    """Default action: save ``interrupted.ckpt`` and exit the process cleanly (status 0), on every rank."""
    path = trainer._checkpoint.save_interrupted()
    rank_zero_info(
        "%s received: saved a checkpoint at global step %d to '%s' and exiting. Resume with "
        "fit(..., ckpt_path='last').", signal.Signals(signum).name, trainer.global_step, path,
    )  # fmt: skip
    raise SystemExit(0)


def checkpoint_and_interrupt(trainer: Any, signum: int) -> None:
    """Default SIGINT action: save ``interrupted.ckpt``, then raise ``KeyboardInterrupt`` as Ctrl-C would."""
    path = trainer._checkpoint.save_interrupted()
    rank_zero_info("Interrupted: saved a checkpoint at global step %d to '%s'.", trainer.global_step, path)
    raise KeyboardInterrupt


class SignalConnector:
    """Installs handlers for the stop signals during a fit, restores the previous ones afterwards."""

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.actions: dict[int, SignalAction] = {
            int(s): checkpoint_and_interrupt if s == signal.SIGINT else checkpoint_and_exit for s in signals
        }
        self.received: Optional[int] = None
        self.on_receive: Optional[Callable[[int], None]] = None
        self._previous: dict[int, Any] = {}
        self._taken_over: set[int] = set()  # signals whose earlier handler must not run (the action replaces it)

    def register(self, signum: Union[int, signal.Signals], action: SignalAction) -> None:
        """Run ``action(trainer, signum)`` on every rank, at a step boundary, when ``signum`` arrives."""
        self.actions[int(signum)] = action

    def take_over(self, signum: Union[int, signal.Signals]) -> None:
        """Do not chain the handler installed before for ``signum``: the registered action does its job (submitit's
        handler would requeue and exit at once, mid-step, before the checkpoint is saved)."""
        self._taken_over.add(int(signum))

    def install(self) -> None:
        """Handle the registered signals (main thread only; elsewhere Python cannot install handlers)."""
        self.received = None
        if not self.actions:
            return
        if threading.current_thread() is not threading.main_thread():
            rank_zero_warn("fit() runs outside the main thread: stop signals are not handled during this fit.")
            return
        for signum in self.actions:
            previous = signal.getsignal(signum)
            if signum == signal.SIGINT and previous == signal.SIG_IGN:
                continue  # started in the background with Ctrl-C ignored, as Python itself respects
            self._previous[signum] = previous
            signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Put back the handlers that were installed before :meth:`install`; a signal that arrived too late to be
        acted on (after the last step) is delivered to them, so the process still does what it was asked."""
        pending, self.received = self.received, None
        chained = pending is not None and (pending in self._taken_over or _chains(self._previous.get(pending)))
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        if pending is not None and not chained:
            signal.raise_signal(pending)

    def act(self, trainer: Any, signum: int) -> None:
        """Run the action registered for ``signum`` (every rank calls this at the same step)."""
        self.received = None
        self.actions[signum](trainer, signum)

    def _handle(self, signum: int, frame: Any) -> None:
        previous = self._previous.get(signum)
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            # Second Ctrl-C: the user does not want to wait for the step to finish.
            self.received = None
            if writing_checkpoint():
                _stop_now_while_saving()
            handler = previous if callable(previous) else signal.default_int_handler
            handler(signum, frame)
            return
        if self.received is None:
            self.received = signum
        if _chains(previous) and signum not in self._taken_over:
            previous(signum, frame)  # chain the handler the user had installed
        if self.on_receive is not None:
            self.on_receive(signum)


def _stop_now_while_saving() -> None:
    """A second Ctrl-C while a checkpoint is being written: an exception raised inside torch's writer comes out as
    its internal ``RuntimeError``, and unwinding then takes seconds. Stop here, at once. Nothing is lost: the file
    being written is a temporary (removed by the next save) and every checkpoint written before is intact."""
    sys.stderr.write("\nInterrupted again while a checkpoint was being written: stopping now. The checkpoints "
                     "saved before are intact; the one being written is discarded. Resume with "
                     "fit(..., ckpt_path='last').\n")  # fmt: skip
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(130)  # 128 + SIGINT, as a shell reports an interrupted program


def _chains(previous: Any) -> bool:
    """Whether a handler found at install time is called as soon as its signal arrives (a user's function)."""
    return callable(previous) and previous is not signal.default_int_handler
