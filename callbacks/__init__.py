"""Callbacks: plug-ins the Trainer calls at fixed points of the loop.

Each callback lives in its own module, imported when its name is first used (``from trainer.callbacks import
Timer``), so ``import trainer`` does not pay for callbacks a run does not use. What callbacks use of the Trainer
is written down in :mod:`trainer.callbacks.host`, their only door into ``trainer/``.
"""
from __future__ import annotations

if __name__ == "callbacks":  # the short name, from a source checkout: one module tree, under trainer.callbacks
    from trainer._source_layout import alias_short_name

    alias_short_name(__name__)

import importlib
from typing import TYPE_CHECKING, Any

from trainer.callbacks.callback import Callback

if TYPE_CHECKING:  # pragma: no cover  (for type checkers; at run time __getattr__ imports on use)
    from trainer.callbacks.batch_size_finder import BatchSizeFinder  # noqa: F401
    from trainer.callbacks.prediction_writer import BasePredictionWriter  # noqa: F401
    from trainer.callbacks.early_stopping import EarlyStoppingReason  # noqa: F401
    from trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning  # noqa: F401
    from trainer.callbacks.tqdm_progress import TQDMProgressBar  # noqa: F401
    from trainer.callbacks.early_stopping import EarlyStopping  # noqa: F401
    from trainer.callbacks.fit_report import FitReport  # noqa: F401
    from trainer.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler  # noqa: F401
    from trainer.callbacks.hf_checkpoint import HFCheckpoint  # noqa: F401
    from trainer.callbacks.lambda_callback import LambdaCallback  # noqa: F401
    from trainer.callbacks.lr_finder import LearningRateFinder  # noqa: F401
    from trainer.callbacks.lr_monitor import LearningRateMonitor  # noqa: F401
    from trainer.callbacks.memory_monitor import MemoryMonitor  # noqa: F401
    from trainer.callbacks.model_checkpoint import ModelCheckpoint  # noqa: F401
    from trainer.callbacks.model_summary import ModelSummary  # noqa: F401
    from trainer.callbacks.progress_bar import ProgressBar  # noqa: F401
    from trainer.callbacks.replica_monitor import ReplicaMonitor  # noqa: F401
    from trainer.callbacks.rich_progress import RichProgressBar  # noqa: F401
    from trainer.callbacks.stochastic_weight_averaging import StochasticWeightAveraging  # noqa: F401
    from trainer.callbacks.throughput_monitor import ThroughputMonitor  # noqa: F401
    from trainer.callbacks.timer import Timer  # noqa: F401

_LAZY = {
    "BackboneFinetuning": "trainer.callbacks.finetuning",
    "BaseFinetuning": "trainer.callbacks.finetuning",
    "BasePredictionWriter": "trainer.callbacks.prediction_writer",
    "BatchSizeFinder": "trainer.callbacks.batch_size_finder",
    "EarlyStoppingReason": "trainer.callbacks.early_stopping",
    "EarlyStopping": "trainer.callbacks.early_stopping",
    "FitReport": "trainer.callbacks.fit_report",
    "GradientAccumulationScheduler": "trainer.callbacks.gradient_accumulation_scheduler",
    "HFCheckpoint": "trainer.callbacks.hf_checkpoint",
    "LambdaCallback": "trainer.callbacks.lambda_callback",
    "LearningRateFinder": "trainer.callbacks.lr_finder",
    "LearningRateMonitor": "trainer.callbacks.lr_monitor",
    "MemoryMonitor": "trainer.callbacks.memory_monitor",
    "ModelCheckpoint": "trainer.callbacks.model_checkpoint",
    "ModelSummary": "trainer.callbacks.model_summary",
    "ProgressBar": "trainer.callbacks.progress_bar",
    "ReplicaMonitor": "trainer.callbacks.replica_monitor",
    "RichProgressBar": "trainer.callbacks.rich_progress",
    "StochasticWeightAveraging": "trainer.callbacks.stochastic_weight_averaging",
    "ThroughputMonitor": "trainer.callbacks.throughput_monitor",
    "Timer": "trainer.callbacks.timer",
    "TQDMProgressBar": "trainer.callbacks.tqdm_progress",
}

__all__ = ["Callback", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer.callbacks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
