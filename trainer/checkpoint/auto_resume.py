"""Which checkpoint a fit resumes from by itself: ``ckpt_path="auto"``, ``"last"``, and restarted jobs.

The policy (Composer calls it autoresume): ``fit(ckpt_path="auto")`` resumes from the newest complete checkpoint
of this run and starts from the module's weights when there is none yet. The run's checkpoints are those in
the folders of its ``ModelCheckpoint`` callbacks (``dirpath``, by default ``<log_dir>/checkpoints``) and, when
those hold none, in the same folder of the experiment's earlier ``version_N`` runs (a restarted script's
logger opens a new version). The newest is the one written last (``last.ckpt`` wins a tie: it names the
checkpoint it mirrors). A candidate that does not match what it recorded when written — truncated, corrupted,
a sharded folder without its manifest — is skipped with a warning naming it and why, and the next newest is
taken; when every candidate is damaged the fit stops with a ``CheckpointError`` rather than start over.

``ckpt_path="last"`` chooses the same way and differs only in warning when there is nothing to resume.

A restarted job resumes without being told: when ``fit()`` gets no ``ckpt_path`` and torchrun's elastic agent
restarted the workers (``TORCHELASTIC_RESTART_COUNT`` > 0, ``trainer run --max-restarts N``) or SLURM requeued
the job (``SLURM_RESTART_COUNT`` > 0, :mod:`trainer.faults.slurm_requeue`), ``fit()`` behaves as with
``ckpt_path="auto"``; so does every fit of a job that sets ``TRAINER_AUTO_RESUME=1`` (``trainer k8s`` manifests: a
pod restarted in place cannot tell), starting over while there is no checkpoint yet. Under Ray Train, a worker group that Ray restarted resumes from the checkpoint Ray holds
(``ray.train.get_checkpoint()``, :mod:`trainer.integrations.ray`). A ``ckpt_path`` given explicitly always wins.
"""
from __future__ import annotations

import os
from typing import Any, Optional


AUTO = "auto"
#: Set by launchers whose restarts leave no trace (a Kubernetes pod restarted in place): fit() resumes as "auto".
AUTO_RESUME_VARIABLE = "TRAINER_AUTO_RESUME"


def restart_reason(trainer: Any) -> Optional[str]:
    """Why this job is a restart ("requeued SLURM job (restart 1)", ...), or ``None`` on a first run."""
    from trainer.faults.slurm_requeue import slurm_environment

    env = slurm_environment(trainer)
    if env is not None and env.restart_count() > 0:
        return f"requeued SLURM job (restart {env.restart_count()})"
    elastic = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if "TORCHELASTIC_RUN_ID" in os.environ and elastic.isdigit() and int(elastic) > 0:
        return f"workers restarted by the elastic agent (restart {elastic})"
    if os.environ.get(AUTO_RESUME_VARIABLE) == "1":  # a pod cannot tell a restart from a first start
        return f"{AUTO_RESUME_VARIABLE}=1 (a job written by `trainer k8s`)"
    return None


def fit_ckpt_path(trainer: Any, ckpt_path: Any) -> Any:
    """The ``ckpt_path`` a fit uses: the one given, else the cluster's own checkpoint (Ray's ``get_checkpoint()``
    in a restarted worker group), else ``"auto"`` in a restarted job."""
    source = trainer._checkpoint.resume_source
    if ckpt_path is None and source is not None:
        found = source()
        if found is not None:
            return found
    if ckpt_path is None and restart_reason(trainer) is not None:
        return AUTO
    return ckpt_path


def announce(trainer: Any, path: Optional[str], folders: list[str]) -> None:
    """Say on global rank 0 what ``"auto"`` chose (printed: it is what a restarted job's log must show)."""
    if not trainer.is_global_zero:
        return
    reason = restart_reason(trainer) or "ckpt_path='auto'"
    if path:
        print(f"[trainer] {reason}: resuming from '{path}'.", flush=True)
    else:
        looked = ", ".join(folders) or "(no folder)"
        print(f"[trainer] {reason}: no checkpoint found in the run's folder ({looked}): training starts over.",
              flush=True)  # fmt: skip
