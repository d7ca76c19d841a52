"""What every cluster environment answers: how many processes, which one this is, where rank 0 listens."""
from __future__ import annotations

import os

from trainer.strategies.errors import ConfigurationError


def env_int(name: str, default: int | None = None) -> int:
    """Read an integer environment variable; a malformed value is a clear error, not a ``ValueError``."""
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ConfigurationError(f"The environment variable {name} is not set; it is needed to join the job.")
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"The environment variable {name}={value!r} must be an integer.") from None


class ClusterEnvironment:
    """A source of process topology. Subclasses read it from their launcher's environment variables.

    ``creates_processes_externally`` is True when something else (torchrun, srun, or an earlier launch of
    the Trainer) already started every process, so the strategy must join instead of launching.
    """

    creates_processes_externally: bool = True

    def world_size(self) -> int:
        """Number of processes in the whole job."""
        raise NotImplementedError

    def global_rank(self) -> int:
        """This process's rank in the whole job."""
        raise NotImplementedError

    def local_rank(self) -> int:
        """This process's rank on its node."""
        raise NotImplementedError

    def node_rank(self) -> int:
        """This process's node index."""
        raise NotImplementedError

    def local_world_size(self) -> int:
        """Processes per node."""
        raise NotImplementedError

    @property
    def main_address(self) -> str:
        """Host of global rank 0 (``MASTER_ADDR``)."""
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        """Port where global rank 0 listens for the rendezvous (``MASTER_PORT``)."""
        return env_int("MASTER_PORT")

    def validate(self, num_devices: int, num_nodes: int) -> None:
        """Raise :class:`ConfigurationError` when ``devices``×``num_nodes`` contradicts the environment."""

    def check_launch(self) -> None:
        """Raise :class:`ConfigurationError` when processes cannot be started here (called by the launchers)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
