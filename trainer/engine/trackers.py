"""``Engine(loggers=...)``: the experiment loggers a hand-written loop writes to (the Trainer's loggers).

Names are created by ``engine.init_trackers(project_name)`` under ``project_dir/project_name/version_N``;
``Logger`` instances are used as they are. Only global rank 0 writes.
"""
from __future__ import annotations

import os
from typing import Any, Union

from trainer.loggers.logger import Logger
from trainer.strategies.errors import ConfigurationError

TRACKER_NAMES = ("tensorboard", "csv")

TrackerSpec = Union[str, Logger]


def check_trackers(loggers: Any) -> list[TrackerSpec]:
    """Validate ``loggers``: None/False (none), True (TensorBoard, else CSV), a name in :data:`TRACKER_NAMES`,
    a ``Logger``, or a list of names and loggers."""
    if loggers is None or loggers is False:
        return []
    items = list(loggers) if isinstance(loggers, (list, tuple)) else [loggers]
    specs: list[TrackerSpec] = []
    for item in items:
        if item is True:
            specs.append("default")
        elif isinstance(item, str) and item.lower() in TRACKER_NAMES:
            specs.append(item.lower())
        elif isinstance(item, Logger):
            specs.append(item)
        else:
            raise ConfigurationError(
                f"loggers={item!r} is not valid. Use True (TensorBoard, or CSV without tensorboard), "
                f"{', '.join(repr(n) for n in TRACKER_NAMES)}, a loggers.Logger instance, or a list of them."
            )
    return specs


def create_trackers(specs: list[TrackerSpec], project_dir: Union[str, os.PathLike], project_name: str) -> list[Logger]:
    """The loggers for ``specs``: names become new loggers in ``project_dir/project_name/version_N``."""
    created: list[Logger] = []
    for spec in specs:
        if isinstance(spec, Logger):
            created.append(spec)
        elif spec == "default":
            from trainer.loggers import default_logger

            created.append(default_logger(os.fspath(project_dir), project_name))
        elif spec == "tensorboard":
            from trainer.loggers.tensorboard_logger import TensorBoardLogger

            created.append(TensorBoardLogger(project_dir, name=project_name))
        else:
            from trainer.loggers.csv_logger import CSVLogger

            created.append(CSVLogger(project_dir, name=project_name))
    return created
