"""Processes on this machine that the Trainer starts itself (or that a user starts by hand, one launch per node)."""
from __future__ import annotations

import os
import socket

from trainer.strategies.launch.environments.base import ClusterEnvironment, env_int
from trainer.strategies.errors import ConfigurationError

DEFAULT_MULTI_NODE_PORT = 29500


def find_free_port() -> int:
    """A TCP port that is free on this host right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class LocalEnvironment(ClusterEnvironment):
    """Topology from ``devices``/``num_nodes`` before launch and from the launch variables after it.

    The launcher exports ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK``, ``LOCAL_RANK``,
    ``RANK`` and ``LOCAL_WORLD_SIZE`` to every process it starts (and to itself), so a process that sees
    ``LOCAL_RANK`` joins instead of launching again. For several nodes, start the script once per node with
    ``NODE_RANK`` (0..num_nodes-1) and ``MASTER_ADDR`` (the host of node 0) set; ``MASTER_PORT`` defaults to
    29500 there, and to a free port on one node.
    """

    def __init__(self) -> None:
        self._num_devices = 1
        self._num_nodes = 1
        self._port: int | None = None

    @staticmethod
    def detect() -> bool:
        """True in a process started by the Trainer's launcher (or by hand with the same variables)."""
        return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ

    @property
    def creates_processes_externally(self) -> bool:  # type: ignore[override]
        """True once the processes exist (this one was started by a launch, or already launched the others)."""
        return "LOCAL_RANK" in os.environ

    @property
    def num_nodes(self) -> int:
        """Nodes in the job, as configured by ``num_nodes``."""
        return self._num_nodes

    def world_size(self) -> int:
        return env_int("WORLD_SIZE", self._num_devices * self._num_nodes)

    def global_rank(self) -> int:
        if "RANK" in os.environ:
            return env_int("RANK")
        return self.node_rank() * self.local_world_size() + self.local_rank()

    def local_rank(self) -> int:
        return env_int("LOCAL_RANK", 0)

    def node_rank(self) -> int:
        return env_int("NODE_RANK", env_int("GROUP_RANK", 0))

    def local_world_size(self) -> int:
        return env_int("LOCAL_WORLD_SIZE", self._num_devices)

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return env_int("MASTER_PORT")
        if self._port is None:
            self._port = DEFAULT_MULTI_NODE_PORT if self._num_nodes > 1 else find_free_port()
        return self._port

    def launch_variables(self, local_rank: int) -> dict[str, str]:
        """The variables a process started by the launcher needs to join (for ``local_rank`` on this node)."""
        return {
            "MASTER_ADDR": self.main_address,
            "MASTER_PORT": str(self.main_port),
            "WORLD_SIZE": str(self.world_size()),
            "NODE_RANK": str(self.node_rank()),
            "LOCAL_WORLD_SIZE": str(self.local_world_size()),
            "LOCAL_RANK": str(local_rank),
            "RANK": str(self.node_rank() * self.local_world_size() + local_rank),
        }

    def check_launch(self) -> None:
        """Raise before starting processes when a multi-node job lacks the variables that place this node.

        Checked at launch (the first fit/validate/test/predict), not when the Trainer is built, so a script can
        build its Trainer (as Lightning allows) on a machine that will not run it."""
        num_nodes = self._num_nodes
        missing = [name for name in ("NODE_RANK", "MASTER_ADDR") if name not in os.environ]
        if num_nodes > 1 and missing and "GROUP_RANK" not in os.environ:
            raise ConfigurationError(
                f"num_nodes={num_nodes} needs {' and '.join(missing)} in the environment: start the same script "
                "once on every node with NODE_RANK=0..num_nodes-1 and MASTER_ADDR=<host of node 0> (optionally "
                f"MASTER_PORT, default {DEFAULT_MULTI_NODE_PORT}), e.g. `NODE_RANK=1 MASTER_ADDR=node0 python "
                "train.py`; or use torchrun or SLURM, which set them."
            )

    def validate(self, num_devices: int, num_nodes: int) -> None:
        self._num_devices, self._num_nodes = num_devices, num_nodes
        if num_nodes > 1:
            if not 0 <= self.node_rank() < num_nodes:
                raise ConfigurationError(f"NODE_RANK={self.node_rank()} must be in 0..{num_nodes - 1} for num_nodes={num_nodes}.")
        if self.creates_processes_externally:
            expected = num_devices * num_nodes
            if self.world_size() != expected:
                raise ConfigurationError(
                    f"This process belongs to a job of WORLD_SIZE={self.world_size()} processes, but this Trainer is "
                    f"configured for devices={num_devices} x num_nodes={num_nodes} = {expected}. Every Trainer in a "
                    "multi-process script must use the same devices and num_nodes."
                )
            if self.local_rank() >= num_devices:
                raise ConfigurationError(
                    f"LOCAL_RANK={self.local_rank()} but only devices={num_devices} per node are configured."
                )
