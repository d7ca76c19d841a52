"""A pod of a Kubeflow job that runs the script directly (no torchrun): the Trainer starts the pod's processes.

Kubeflow's training operator gives every pod of a ``PyTorchJob`` (v1) ``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE`` = the number of pods and ``RANK`` = the pod's index, i.e. node-level values, however many
processes the pod will run. Newer operator releases with ``nprocPerNode`` (and Kubeflow Trainer v2's ``TrainJob``)
add ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` (torchrun's
arguments as variables) and set ``WORLD_SIZE`` to every process of the job: when ``PET_*`` is there it wins.

A pod whose command is ``torchrun`` (TrainJob's default) is torchrun's job instead: its workers see
``TORCHELASTIC_RUN_ID`` and join through :class:`~trainer.strategies.launch.environments.TorchElasticEnvironment`.
"""
from __future__ import annotations

import os
from typing import Optional

from trainer.strategies.launch.environments.base import env_int
from trainer.strategies.launch.environments.per_node import PerNodeEnvironment

_POD_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_PET_VARIABLES = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR")


def _pet_int(name: str) -> Optional[int]:
    """``name`` as an integer, ``None`` when unset or not a number (``PET_NPROC_PER_NODE=auto``, an elastic
    ``PET_NNODES=1:4``)."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


class KubeflowEnvironment(PerNodeEnvironment):
    """Ranks of a pod that starts its own processes: pod index × processes per pod + local rank.

    The pods and this pod's index come from ``PET_NNODES``/``PET_NODE_RANK`` when set, else from PyTorchJob v1's
    ``WORLD_SIZE``/``RANK``. The Trainer starts ``devices`` processes in the pod; ``num_nodes`` must equal the
    pods (Master + Worker replicas) and ``devices`` ``PET_NPROC_PER_NODE`` when that is a number.
    """

    def __init__(self) -> None:
        pods = _pet_int("PET_NNODES")
        if pods is not None and "PET_NODE_RANK" in os.environ:
            self.source = "PET_NNODES/PET_NODE_RANK"
            node = env_int("PET_NODE_RANK")
        else:
            self.source = "PyTorchJob's WORLD_SIZE/RANK"
            pods, node = env_int("WORLD_SIZE"), env_int("RANK")
        address = os.environ.get("PET_MASTER_ADDR") or os.environ.get("MASTER_ADDR", "127.0.0.1")
        port_name = "PET_MASTER_PORT" if "PET_MASTER_PORT" in os.environ else "MASTER_PORT"
        port = env_int(port_name) if port_name in os.environ else None
        super().__init__(pods, node, address, port, _pet_int("PET_NPROC_PER_NODE"))

    @staticmethod
    def detect() -> bool:
        """True in a pod of a Kubeflow job before any process of it was started (no ``LOCAL_RANK`` yet, not torchrun)."""
        if "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
            return False
        return all(k in os.environ for k in _PET_VARIABLES) or all(k in os.environ for k in _POD_VARIABLES)
