"""Callbacks: plug-ins the Trainer calls at fixed points of the loop.

Each callback lives in its own module, imported when its name is first used (``from callbacks import
Timer``), so ``import trainer`` does not pay for callbacks a run does not use.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from callbacks.callback import Callback

if TYPE_CHECKING:  # pragma: no cover
    from callbacks.batch_size_finder import BatchSizeFinder
    from callbacks.fit_report import FitReport
    from callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
    from callbacks.lr_finder import LearningRateFinder
    from callbacks.lr_monitor import LearningRateMonitor
    from callbacks.memory_monitor import MemoryMonitor
    from callbacks.model_summary import ModelSummary
    from callbacks.rich_progress import RichProgressBar
    from callbacks.throughput_monitor import ThroughputMonitor
    from callbacks.timer import Timer

_LAZY = {
    "BatchSizeFinder": "callbacks.batch_size_finder",
    "FitReport": "callbacks.fit_report",
    "GradientAccumulationScheduler": "callbacks.gradient_accumulation_scheduler",
    "LearningRateFinder": "callbacks.lr_finder",
    "LearningRateMonitor": "callbacks.lr_monitor",
    "MemoryMonitor": "callbacks.memory_monitor",
    "ModelSummary": "callbacks.model_summary",
    "RichProgressBar": "callbacks.rich_progress",
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
