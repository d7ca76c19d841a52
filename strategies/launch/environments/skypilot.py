"""A node of a SkyPilot cluster (``sky launch``/``sky jobs launch``): SkyPilot runs the task's ``run:`` command
once per node with ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS`` (one per line, node 0 first),
``SKYPILOT_NUM_NODES`` and ``SKYPILOT_NUM_GPUS_PER_NODE``; the Trainer starts the node's processes and wires the
rendezvous from them (node 0's IP, ``MASTER_PORT`` or 29500)."""
from __future__ import annotations

import os

from trainer.strategies.launch.environments.base import env_int
from trainer.strategies.launch.environments.per_node import PerNodeEnvironment
from trainer.strategies.errors import ConfigurationError

_VARIABLES = ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES")


def skypilot_node_ips() -> list[str]:
    """The nodes' IPs from ``SKYPILOT_NODE_IPS`` (newline-separated; node 0, the rendezvous host, first)."""
    return [line.strip() for line in os.environ.get("SKYPILOT_NODE_IPS", "").splitlines() if line.strip()]


class SkyPilotEnvironment(PerNodeEnvironment):
    """Ranks node × processes per node + local rank, from ``SKYPILOT_*``; ``num_nodes`` must equal
    ``SKYPILOT_NUM_NODES``. Under ``torchrun`` in the ``run:`` command, torchrun's environment applies instead."""

    source = "SKYPILOT_NUM_NODES/SKYPILOT_NODE_RANK"

    def __init__(self) -> None:
        nodes, ips = env_int("SKYPILOT_NUM_NODES"), skypilot_node_ips()
        if len(ips) != nodes:
            raise ConfigurationError(
                f"SKYPILOT_NUM_NODES={nodes} but SKYPILOT_NODE_IPS lists {len(ips)} address(es); SkyPilot sets both. "
                "Run the script from the task's `run:` command, not from a shell of your own."
            )
        port = env_int("MASTER_PORT") if "MASTER_PORT" in os.environ else None
        super().__init__(nodes, env_int("SKYPILOT_NODE_RANK"), ips[0], port)

    @staticmethod
    def detect() -> bool:
        """True on a SkyPilot node before the Trainer started its processes (no ``LOCAL_RANK``, not torchrun)."""
        if "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
            return False
        return all(k in os.environ for k in _VARIABLES)
