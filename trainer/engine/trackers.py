"""``Engine(loggers=...)``: the experiment loggers a hand-written loop writes to (the Trainer's loggers), and the
Accelerate-style trackers ``engine.trackers``/``get_tracker`` hand out over them.

Names are created by ``engine.init_trackers(project_name)`` under ``project_dir/project_name/version_N``;
``Logger`` instances are used as they are. Only global rank 0 writes: other ranks get no trackers, and
``get_tracker`` gives them a :class:`NoOpTracker` (as Accelerate does).
"""
from __future__ import annotations

import importlib.util
import numbers
import os
from typing import Any, Optional, Union

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
                f"{', '.join(repr(n) for n in TRACKER_NAMES)}, a trainer.loggers.Logger instance, or a list of them."
            )
    return specs


def create_trackers(specs: list[TrackerSpec], project_dir: Union[str, os.PathLike], project_name: str,
                    versioned: bool = True) -> list[Logger]:
    """The loggers for ``specs``: names become new loggers in ``project_dir/project_name/version_N``; with
    ``versioned=False`` the TensorBoard one writes in ``project_dir/project_name`` itself, as Accelerate's does."""
    created: list[Logger] = []
    for spec in specs:
        if isinstance(spec, Logger):
            created.append(spec)
        elif spec == "tensorboard" or (spec == "default" and importlib.util.find_spec("tensorboard") is not None):
            from trainer.loggers.tensorboard_logger import TensorBoardLogger

            # Accelerate's tracker records the configuration alone: no hp_metric placeholder (Lightning's).
            version = None if versioned else ""
            created.append(TensorBoardLogger(project_dir, name=project_name, version=version, default_hp_metric=False))
        else:
            from trainer.loggers.csv_logger import CSVLogger

            created.append(CSVLogger(project_dir, name=project_name))
    return created


class Tracker:
    """Accelerate's tracker API (``GeneralTracker``) over one of our loggers: ``name`` ("tensorboard", "csv",
    "mlflow", "wandb"), ``log(values, step)``, ``store_init_configuration(values)``, ``finish()``, and the
    underlying writer as ``tracker`` (``writer`` too, as Accelerate's TensorBoard tracker has it). Anything else is
    the logger's (e.g. ``log_metrics``)."""

    main_process_only = True
    requires_logging_directory = True

    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    @property
    def name(self) -> str:
        """The tracker's kind, as ``log_with``/``get_tracker`` name it."""
        return type(self.logger).__name__.lower().removesuffix("logger")

    @property
    def tracker(self) -> Any:
        """The underlying writer (TensorBoard's ``SummaryWriter``, ...)."""
        return getattr(self.logger, "experiment", self.logger)

    @property
    def writer(self) -> Any:
        """:attr:`tracker` (Accelerate's TensorBoard tracker's name for it)."""
        return self.tracker

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record ``values`` as the run's hyperparameters (``hparams.yaml``; TensorBoard's HParams)."""
        self.logger.log_hyperparams(dict(values))

    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log numbers (and one-element tensors) as scalars and, on TensorBoard, strings as text. A dict of
        numbers is, on TensorBoard, one chart as Accelerate draws it (``add_scalars``: tag ``key`` in the runs
        ``<run>/key_<sub>``); on other trackers ``key/sub`` scalars."""
        if kwargs:
            raise ConfigurationError(f"tracker.log(..., {', '.join(kwargs)}=...) is not supported: our trackers take "
                                     "values and step only.")  # fmt: skip
        scalars: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, dict) and hasattr(self.tracker, "add_scalars"):
                self.tracker.add_scalars(key, dict(value), global_step=step)
            elif isinstance(value, dict):
                scalars.update({f"{key}/{sub}": item for sub, item in value.items()})
            elif isinstance(value, str):
                add_text = getattr(self.tracker, "add_text", None)
                if add_text is None:
                    raise ConfigurationError(f"tracker {self.name!r} cannot log the text value {key!r}; log it with "
                                             "the 'tensorboard' tracker, or log numbers only.")  # fmt: skip
                add_text(key, value, global_step=step)
            elif isinstance(value, numbers.Number) or getattr(value, "numel", lambda: 0)() == 1:
                scalars[key] = value
            else:
                raise ConfigurationError(f"tracker.log: {key!r} is a {type(value).__name__}; log numbers, one-element "
                                         "tensors, dicts of them, or strings.")  # fmt: skip
        if scalars:
            self.logger.log_metrics(scalars, step)

    def finish(self) -> None:
        """Close the writer (``end_training`` calls it)."""
        self.logger.finalize("success")

    def __getattr__(self, name: str) -> Any:
        if name == "logger":  # not set yet (while unpickling)
            raise AttributeError(name)
        return getattr(self.logger, name)

    def __repr__(self) -> str:
        return f"Tracker({self.name!r}, {self.logger!r})"


class NoOpTracker:
    """What ``get_tracker`` gives a rank that does not log: every attribute and call does nothing (so
    ``get_tracker("tensorboard", unwrap=True).add_scalar(...)`` runs on every rank)."""

    name = ""

    def __getattr__(self, name: str) -> "NoOpTracker":
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False
