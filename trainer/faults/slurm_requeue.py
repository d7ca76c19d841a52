"""SLURM auto-requeue: save on the warning signal, requeue the job, resume when it starts again.

Under SLURM (``srun`` tasks, or one task running the Trainer alone) with ``SLURMEnvironment.auto_requeue``:

- the requeue signal (SIGUSR1 by default; ``#SBATCH --signal=USR1@90`` sends it before the time limit) is
  handled like a stop signal (:mod:`trainer.faults.signals`): every rank finishes its optimizer step, all agree on the
  step, ``interrupted.ckpt`` is saved, global rank 0 runs the requeue command (``scontrol requeue JOBID``) and
  every rank exits with status 0. A handler the user installed for that signal still runs (it is chained);
- when the job runs again (``SLURM_RESTART_COUNT`` > 0), ``fit()`` without ``ckpt_path`` resumes from the
  newest good checkpoint of the run (the one saved above, or ModelCheckpoint's): the ``ckpt_path="auto"``
  lookup, which elastic restarts use too (:mod:`trainer.checkpoint.auto_resume`).

SIGTERM (the time limit without a warning, ``scancel``) keeps its default action: save and exit, no requeue.
"""
from __future__ import annotations

import os

import shlex
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    from trainer.strategies.launch.environments.slurm import SLURMEnvironment


def slurm_environment(trainer: Any) -> Optional["SLURMEnvironment"]:
    """The SLURM environment of this Trainer's job, or ``None`` outside SLURM."""
    env = getattr(trainer.strategy, "cluster_environment", None)
    if env is None and "SLURM_NTASKS" not in os.environ:
        return None  # not under SLURM: decided without importing the environments
    from trainer.strategies.launch.environments.slurm import SLURMEnvironment

    if isinstance(env, SLURMEnvironment):
        return env
    if env is None and SLURMEnvironment.detect():  # one task, single-device strategy
        return SLURMEnvironment()
    return None


def connect(trainer: Any) -> None:
    """Make the requeue signal save, requeue and exit (when the job runs under SLURM with auto-requeue)."""
    env = slurm_environment(trainer)
    if env is not None and env.auto_requeue:
        trainer._faults.signals.register(env.requeue_signal, save_and_requeue(env))


def save_and_requeue(env: "SLURMEnvironment") -> Callable[[Any, int], None]:
    """The signal action: save ``interrupted.ckpt`` (every rank), requeue the job (global rank 0), exit."""

    def action(trainer: Any, signum: int) -> None:
        path = trainer._checkpoint.save_interrupted()  # every rank (collectives); rank 0 writes
        if not trainer.is_global_zero:
            raise SystemExit(0)
        name, command = signal.Signals(signum).name, shlex.join(env.requeue_command())
        try:
            env.requeue()
        except RuntimeError as err:
            print(f"[trainer] {name}: saved '{path}' at global step {trainer.global_step}, but the job could not be "
                  f"requeued: {err} Resubmit it: fit() resumes with ckpt_path='last'.", file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(1) from None
        print(f"[trainer] {name}: saved '{path}' at global step {trainer.global_step} and requeued the job with "
              f"`{command}`; it resumes from there.", flush=True)  # fmt: skip
        raise SystemExit(0)

    return action

