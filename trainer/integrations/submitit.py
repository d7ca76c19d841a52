"""submitit: a fit submitted with ``executor.submit(...)`` to SLURM requeues on submitit's timeout signal and
resumes exactly, as a job of ``trainer slurm`` does on SIGUSR1.

submitit asks SLURM for its signal before the time limit (``--signal=USR2@<signal_delay_s>``; the variable
``SUBMITIT_PREEMPT_SIGNAL`` names another) and, on it, requeues only a ``Checkpointable`` callable, at once,
mid-step. In a fit the Trainer takes that signal over instead: every rank finishes its optimizer step, all agree,
``interrupted.ckpt`` is saved, global rank 0 requeues the job (``scontrol requeue``, as
:mod:`trainer.faults.slurm_requeue`) and every rank exits. SLURM then runs the same submission again, and its
``fit()`` without ``ckpt_path`` resumes from that checkpoint (``SLURM_RESTART_COUNT`` > 0). Any submitted
function works; nothing needs to subclass ``Checkpointable``. submitit is never imported here.
"""
from __future__ import annotations

import os
import signal
from typing import Any, Optional

SIGNAL_VARIABLE = "SUBMITIT_PREEMPT_SIGNAL"


def submitit_signal() -> Optional[signal.Signals]:
    """The signal submitit's SLURM job gets before its time limit, or ``None`` outside a submitit SLURM job."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return None
    name = os.environ.get(SIGNAL_VARIABLE, "USR2").upper()
    return getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)


def connect(trainer: Any) -> None:
    """In a submitit SLURM job, make its timeout signal save, requeue and exit (in place of submitit's handler)."""
    signum = submitit_signal()
    if signum is None:
        return
    from trainer.faults import slurm_requeue

    env = slurm_requeue.slurm_environment(trainer)
    if env is None:
        return
    signals = trainer._faults.signals
    signals.register(signum, slurm_requeue.save_and_requeue(env))
    signals.take_over(signum)
