"""Joining a job started by ``torchrun`` (``python -m torch.distributed.run``)."""
from __future__ import annotations

import os

from trainer.strategies.launch.environments.base import ClusterEnvironment, env_int
from trainer.strategies.errors import ConfigurationError


class TorchElasticEnvironment(ClusterEnvironment):
    """Ranks from the variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``). torchrun started every process: never launch more."""

    creates_processes_externally = True

    @staticmethod
    def detect() -> bool:
        """True inside a process started by torchrun (it always exports ``TORCHELASTIC_RUN_ID``)."""
        return "TORCHELASTIC_RUN_ID" in os.environ and all(k in os.environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))

    def world_size(self) -> int:
        return env_int("WORLD_SIZE")

    def global_rank(self) -> int:
        return env_int("RANK")

    def local_rank(self) -> int:
        return env_int("LOCAL_RANK")

    def node_rank(self) -> int:
        return env_int("GROUP_RANK", 0)

    def local_world_size(self) -> int:
        return env_int("LOCAL_WORLD_SIZE", self.world_size())

    def validate(self, num_devices: int, num_nodes: int) -> None:
        world, per_node = self.world_size(), self.local_world_size()
        if num_devices * num_nodes != world:
            nodes = max(world // max(per_node, 1), 1)
            raise ConfigurationError(
                f"torchrun started WORLD_SIZE={world} processes ({per_node} per node), but the Trainer is configured "
                f"for devices={num_devices} x num_nodes={num_nodes} = {num_devices * num_nodes}. Use "
                f"Trainer(devices={per_node}, num_nodes={nodes}) (devices='auto' follows --nproc-per-node), or change "
                "torchrun's --nproc-per-node/--nnodes."
            )
