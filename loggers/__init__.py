"""Loggers: where metrics and hyperparameters go.

``TensorBoardLogger`` and ``CSVLogger`` are always available; ``MLflowLogger`` and ``WandbLogger`` need
their package installed. Each logger module is imported when its name is first used, and each backend
(tensorboard, mlflow, wandb) only when the logger first writes, so ``import trainer`` stays fast.
"""
from __future__ import annotations

if __name__ == "loggers":  # the short name, from a source checkout: one module tree, under trainer.loggers
    from trainer._source_layout import alias_short_name

    alias_short_name(__name__)

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from trainer.loggers.logger import Logger

if TYPE_CHECKING:  # pragma: no cover
    from trainer.loggers.csv_logger import CSVLogger  # noqa: F401
    from trainer.loggers.mlflow_logger import MLflowLogger  # noqa: F401
    from trainer.loggers.tensorboard_logger import TensorBoardLogger  # noqa: F401
    from trainer.loggers.wandb_logger import WandbLogger  # noqa: F401

_LAZY = {
    "CSVLogger": "trainer.loggers.csv_logger",
    "MLflowLogger": "trainer.loggers.mlflow_logger",
    "MLFlowLogger": "trainer.loggers.mlflow_logger",  # Lightning's spelling
    "TensorBoardLogger": "trainer.loggers.tensorboard_logger",
    "WandbLogger": "trainer.loggers.wandb_logger",
}

__all__ = ["CSVLogger", "Logger", "MLFlowLogger", "MLflowLogger", "TensorBoardLogger", "WandbLogger", "default_logger"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer.loggers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


def default_logger(root_dir: str, name: str = "logs") -> Logger:
    """What ``Trainer(logger=True)`` creates: TensorBoard under ``root_dir/name/version_N``, or CSV in the
    same place when the ``tensorboard`` package is missing."""
    if importlib.util.find_spec("tensorboard") is not None:
        from trainer.loggers.tensorboard_logger import TensorBoardLogger

        return TensorBoardLogger(root_dir, name=name)
    from trainer.loggers.csv_logger import CSVLogger

    return CSVLogger(root_dir, name=name)
