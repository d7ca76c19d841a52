"""Cluster schedulers the Trainer cooperates with beyond starting processes: Ray Train (checkpoints reported to
Ray, restarts resumed from Ray's checkpoint) and submitit (requeue on its timeout signal).
Each module imports its library only when used; :func:`connect` costs a dictionary lookup when none is in use."""
from __future__ import annotations

from typing import Any


def connect(trainer: Any) -> None:
    """Wire the Trainer to the scheduler this process runs under (called once by ``Trainer.__init__``)."""
    from trainer.integrations import ray as ray_integration
    from trainer.integrations import submitit as submitit_integration

    ray_integration.connect(trainer)
    submitit_integration.connect(trainer)
