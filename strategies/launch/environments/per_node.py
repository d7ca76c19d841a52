"""A node (pod, cloud VM) that a scheduler placed but whose processes the Trainer starts: the scheduler says how
many nodes there are, which one this is and where node 0 listens; the Trainer starts ``devices`` processes here."""
from __future__ import annotations

import os

from trainer.strategies.launch.environments.base import env_int
from trainer.strategies.launch.environments.local import DEFAULT_MULTI_NODE_PORT, LocalEnvironment
from trainer.strategies.errors import ConfigurationError


class PerNodeEnvironment(LocalEnvironment):
    """Ranks node index × processes per node + local rank, from node-level values a subclass reads.

    Before the launch, the topology is the scheduler's nodes × ``devices``; once the processes run, each reads
    the launch variables like any local launch (``LOCAL_RANK``, ``RANK``, ``WORLD_SIZE``, ...).
    """

    #: what the node values were read from, named in errors
    source = "the scheduler's variables"

    def __init__(self, nodes: int, node: int, address: str, port: int | None = None,
                 per_node: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self._nodes, self._node, self._address, self._fixed_port, self._per_node = nodes, node, address, port, per_node

    def _launched(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    def num_nodes(self) -> int:
        """The nodes of the job, as the scheduler placed them."""
        return self._nodes

    def world_size(self) -> int:
        return env_int("WORLD_SIZE") if self._launched() else self._nodes * self._num_devices

    def global_rank(self) -> int:
        return env_int("RANK") if self._launched() else self._node * self._num_devices + self.local_rank()

    def node_rank(self) -> int:
        return self._node

    def local_world_size(self) -> int:
        return env_int("LOCAL_WORLD_SIZE") if self._launched() else self._num_devices

    @property
    def main_address(self) -> str:
        return self._address

    @property
    def main_port(self) -> int:
        if self._fixed_port is not None:
            return self._fixed_port
        return env_int("MASTER_PORT", DEFAULT_MULTI_NODE_PORT)

    def check_launch(self) -> None:
        """The scheduler's variables place this node: nothing more is needed to start its processes."""

    def validate(self, num_devices: int, num_nodes: int) -> None:
        self._num_devices, self._num_nodes = num_devices, num_nodes
        if num_nodes != self._nodes:
            raise ConfigurationError(
                f"This job has {self._nodes} node(s) ({self.source}), but the Trainer is configured for "
                f"num_nodes={num_nodes}. Set Trainer(num_nodes={self._nodes}), with devices = the processes to "
                "start on each node."
            )
        if not 0 <= self._node < self._nodes:
            raise ConfigurationError(f"The node index {self._node} ({self.source}) must be in 0..{self._nodes - 1}.")
        if self._per_node is not None and self._per_node != num_devices:
            raise ConfigurationError(
                f"The job asks for {self._per_node} processes per node ({self.source}), but the Trainer is configured "
                f"for devices={num_devices}. Make them equal (devices='auto' on GPUs takes every GPU of the node)."
            )
        if self._launched():
            super().validate(num_devices, num_nodes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nodes={self._nodes}, node_rank={self._node})"
