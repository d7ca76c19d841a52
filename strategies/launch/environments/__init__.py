"""Cluster environments: where a job's processes come from and how they find rank 0.

- ``RayEnvironment``: a Ray Train worker (``ray.train`` context); Ray's ``TorchTrainer`` started the processes.
- ``TorchElasticEnvironment``: ``TORCHELASTIC_RUN_ID`` (torchrun, also in a TrainJob pod); torchrun started them.
- ``SLURMEnvironment``: ``SLURM_NTASKS`` + ``SLURM_PROCID``; srun started them.
- ``SkyPilotEnvironment``: ``SKYPILOT_NODE_RANK``/``_NODE_IPS``/``_NUM_NODES``; the Trainer starts each node's.
- ``KubeflowEnvironment``: ``PET_NNODES``/``PET_NODE_RANK``, or PyTorchJob's ``RANK``/``WORLD_SIZE`` per pod;
  the Trainer starts each pod's.
- ``LocalEnvironment``: ``LOCAL_RANK`` + ``WORLD_SIZE``; the Trainer's launcher started them.
"""
from __future__ import annotations

from typing import Optional

from trainer.strategies.launch.environments.base import ClusterEnvironment
from trainer.strategies.launch.environments.kubeflow import KubeflowEnvironment
from trainer.strategies.launch.environments.local import LocalEnvironment
from trainer.strategies.launch.environments.ray import RayEnvironment
from trainer.strategies.launch.environments.skypilot import SkyPilotEnvironment
from trainer.strategies.launch.environments.slurm import SLURMEnvironment, expand_nodelist
from trainer.strategies.launch.environments.torchelastic import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LocalEnvironment",
    "RayEnvironment",
    "SLURMEnvironment",
    "SkyPilotEnvironment",
    "TorchElasticEnvironment",
    "detect_environment",
    "expand_nodelist",
]


def detect_environment() -> Optional[ClusterEnvironment]:
    """The environment of a job that already started this process (torchrun, SLURM, an earlier launch),
    or ``None`` for a plain ``python script.py`` where the Trainer launches the other processes."""
    for cls in (RayEnvironment, TorchElasticEnvironment, SLURMEnvironment, SkyPilotEnvironment, KubeflowEnvironment,
                LocalEnvironment):
        if cls.detect():
            return cls()
    return None
