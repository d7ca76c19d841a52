"""Cluster environments: where a job's processes come from and how they find rank 0.

=========================  ==========================================  ===============================
environment                detected by                                 who starts the processes
=========================  ==========================================  ===============================
``TorchElasticEnvironment``  ``TORCHELASTIC_RUN_ID`` (set by torchrun)   torchrun
``SLURMEnvironment``         ``SLURM_NTASKS`` + ``SLURM_PROCID``         srun
``LocalEnvironment``         ``LOCAL_RANK`` + ``WORLD_SIZE``             the Trainer's launcher
=========================  ==========================================  ===============================
"""
from __future__ import annotations

from typing import Optional

from trainer.strategies.launch.environments.base import ClusterEnvironment
from trainer.strategies.launch.environments.local import LocalEnvironment
from trainer.strategies.launch.environments.slurm import SLURMEnvironment, expand_nodelist
from trainer.strategies.launch.environments.torchelastic import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "LocalEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "detect_environment",
    "expand_nodelist",
]


def detect_environment() -> Optional[ClusterEnvironment]:
    """The environment of a job that already started this process (torchrun, SLURM, an earlier launch),
    or ``None`` for a plain ``python script.py`` where the Trainer launches the other processes."""
    for cls in (TorchElasticEnvironment, SLURMEnvironment, LocalEnvironment):
        if cls.detect():
            return cls()
    return None
