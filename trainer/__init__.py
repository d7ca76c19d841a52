"""trainer: write the science, not the loop.

``Trainer(devices=4, precision=16, accumulate_grad_batches=16).fit(module, data)``.
"""
from strategies.errors import ConfigurationError
from strategies.rank import rank_zero_info, rank_zero_only, rank_zero_warn
from trainer.datamodule import DataModule
from trainer.module import TrainModule
from trainer.seed import seed_everything
from trainer.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DataModule",
    "TrainModule",
    "Trainer",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "seed_everything",
]
