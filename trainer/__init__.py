"""trainer: write the science, not the loop.

``Trainer(devices=4, precision=16, accumulate_grad_batches=16).fit(module, data)``; for a loop of your own,
``Engine`` (imported on first use, so ``import trainer`` does not pay for it).
"""
from typing import Any

from trainer._source_layout import install as _install_source_layout

_install_source_layout()  # before anything imports trainer.strategies and friends

from trainer.strategies.errors import ConfigurationError
from trainer.callbacks.callback import Callback
from trainer.strategies.rank import rank_zero_info, rank_zero_only, rank_zero_warn
from trainer.data.combined_loader import CombinedLoader
from trainer.faults.nonfinite import NonFiniteLossError
from trainer.module.datamodule import DataModule
from trainer.module.train_module import TrainModule
from trainer.reproducibility.seed import seed_everything
from trainer.trainer import Trainer
from trainer.trainer_cli import TrainerCLI

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "CombinedLoader",
    "ConfigurationError",
    "DataModule",
    "Engine",
    "NonFiniteLossError",
    "TrainModule",
    "Trainer",
    "TrainerCLI",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "seed_everything",
]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from trainer.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
