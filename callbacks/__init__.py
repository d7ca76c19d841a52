"""Callbacks: plug-ins the Trainer calls at fixed points of the loop.

Each callback lives in its own module, imported when its name is first used (``from callbacks import
Timer``), so ``import trainer`` does not pay for callbacks a run does not use.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from callbacks.callback import Callback

if TYPE_CHECKING:  # pragma: no cover  (for type checkers; at run time __getattr__ imports on use)
    from callbacks.batch_size_finder import BatchSizeFinder  # noqa: F401
    from callbacks.early_stopping import EarlyStopping  # noqa: F401
    from callbacks.fit_report import FitReport  # noqa: F401
    from callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler  # noqa: F401
    from callbacks.lr_finder import LearningRateFinder  # noqa: F401
    from callbacks.lr_monitor import LearningRateMonitor  # noqa: F401
    from callbacks.memory_monitor import MemoryMonitor  # noqa: F401
    from callbacks.model_checkpoint import ModelCheckpoint  # noqa: F401
    from callbacks.model_summary import ModelSummary  # noqa: F401
    from callbacks.rich_progress import RichProgressBar  # noqa: F401
    from callbacks.stochastic_weight_averaging import StochasticWeightAveraging  # noqa: F401
    from callbacks.throughput_monitor import ThroughputMonitor  # noqa: F401
    from callbacks.timer import Timer  # noqa: F401

_LAZY = {
    "BatchSizeFinder": "callbacks.batch_size_finder",
    "EarlyStopping": "callbacks.early_stopping",
    "FitReport": "callbacks.fit_report",
    "GradientAccumulationScheduler": "callbacks.gradient_accumulation_scheduler",
    "LearningRateFinder": "callbacks.lr_finder",
    "LearningRateMonitor": "callbacks.lr_monitor",
    "MemoryMonitor": "callbacks.memory_monitor",
    "ModelCheckpoint": "callbacks.model_checkpoint",
    "ModelSummary": "callbacks.model_summary",
    "RichProgressBar": "callbacks.rich_progress",
    "StochasticWeightAveraging": "callbacks.stochastic_weight_averaging",
    "ThroughputMonitor": "callbacks.throughput_monitor",
    "Timer": "callbacks.timer",
}

__all__ = ["Callback", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'callbacks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
