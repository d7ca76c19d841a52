"""Joining a Ray Train worker group: ranks from Ray's train context, the process group Ray already made.

Ray's ``TorchTrainer`` starts one worker process per ``ScalingConfig.num_workers``, creates the default process
group in each (``TorchConfig(backend=...)``) and exports ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/... before
``train_loop_per_worker`` runs. The strategy joins that group (it never creates or destroys it) and starts nothing.
"""
from __future__ import annotations

import sys
from typing import Any

from trainer.strategies.launch.environments.base import ClusterEnvironment
from trainer.strategies.errors import ConfigurationError


def ray_train_context() -> Any:
    """Ray Train's context of this worker, or ``None`` outside a Ray Train worker.

    Ray is not imported here: a process that has not imported ``ray.train`` cannot be a Ray Train worker (the
    worker imports it before it runs the training function), so a plain run pays one dictionary lookup."""
    if "ray.train" not in sys.modules:
        return None
    import ray.train

    try:
        return ray.train.get_context()
    except (RuntimeError, ValueError, AttributeError):  # the driver, a Tune trial, or a plain Ray task
        return None


class RayEnvironment(ClusterEnvironment):
    """Ranks from ``ray.train.get_context()`` (world rank, local rank, node rank and their sizes).

    Ray started every process and made the process group: never launch more. ``devices="auto"`` follows the
    workers per node; ``devices``×``num_nodes`` must equal ``ScalingConfig.num_workers``.
    """

    creates_processes_externally = True

    def __init__(self) -> None:
        context = ray_train_context()
        if context is None:
            raise ConfigurationError(
                "RayEnvironment() is only valid inside a Ray Train worker (the function given to "
                "ray.train.torch.TorchTrainer); outside one, leave the environment to detection."
            )
        self._context = context

    @staticmethod
    def detect() -> bool:
        """True inside a Ray Train worker (``train_loop_per_worker`` of a ``TorchTrainer``)."""
        return ray_train_context() is not None

    def world_size(self) -> int:
        return int(self._context.get_world_size())

    def global_rank(self) -> int:
        return int(self._context.get_world_rank())

    def local_rank(self) -> int:
        return int(self._context.get_local_rank())

    def node_rank(self) -> int:
        return int(self._context.get_node_rank())

    def local_world_size(self) -> int:
        return int(self._context.get_local_world_size())

    def validate(self, num_devices: int, num_nodes: int) -> None:
        world, per_node = self.world_size(), self.local_world_size()
        if num_devices * num_nodes != world:
            nodes = max(world // max(per_node, 1), 1)
            raise ConfigurationError(
                f"Ray Train started {world} workers ({per_node} on this node), but the Trainer is configured for "
                f"devices={num_devices} x num_nodes={num_nodes} = {num_devices * num_nodes}. Use "
                f"Trainer(devices={per_node}, num_nodes={nodes}) (devices='auto' follows the workers per node), or "
                "change ScalingConfig(num_workers=...)."
            )

    def __repr__(self) -> str:
        return f"RayEnvironment(world_size={self.world_size()}, rank={self.global_rank()})"
