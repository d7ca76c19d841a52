"""Loggers: where metrics and hyperparameters go.

``TensorBoardLogger`` and ``CSVLogger`` are always available; ``MLflowLogger`` and ``WandbLogger`` need
their package installed. Each logger module is imported when its name is first used, and each backend
(tensorboard, mlflow, wandb) only when the logger first writes, so ``import trainer`` stays fast.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from loggers.logger import Logger

if TYPE_CHECKING:  # pragma: no cover
    from loggers.csv_logger import CSVLogger  # noqa: F401
    from loggers.mlflow_logger import MLflowLogger  # noqa: F401
    from loggers.tensorboard_logger import TensorBoardLogger  # noqa: F401
    from loggers.wandb_logger import WandbLogger  # noqa: F401

_LAZY = {
    "CSVLogger": "loggers.csv_logger",
    "MLflowLogger": "loggers.mlflow_logger",
    "TensorBoardLogger": "loggers.tensorboard_logger",
    "WandbLogger": "loggers.wandb_logger",
}

__all__ = ["CSVLogger", "Logger", "MLflowLogger", "TensorBoardLogger", "WandbLogger", "default_logger"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loggers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


def default_logger(root_dir: str) -> Logger:
    """What ``Trainer(logger=True)`` creates: TensorBoard under ``root_dir/logs/version_N``, or CSV in the
    same place when the ``tensorboard`` package is missing."""
    if importlib.util.find_spec("tensorboard") is not None:
        from loggers.tensorboard_logger import TensorBoardLogger

        return TensorBoardLogger(root_dir)
    from loggers.csv_logger import CSVLogger

    return CSVLogger(root_dir)
