"""Lightning's ``pytorch_lightning.core`` names after the rename (``trainer.core``): aliases of ours, for ported
imports. ``LightningModule`` is ``TrainModule``, ``LightningDataModule`` is ``DataModule``; both spellings import
here, since the documented rename turns ``from lightning.pytorch.core import LightningModule`` into
``from trainer.core import TrainModule``."""
from trainer.module.datamodule import DataModule
from trainer.module.train_module import TrainModule

LightningDataModule = DataModule
LightningModule = TrainModule

__all__ = ["DataModule", "LightningDataModule", "LightningModule", "TrainModule"]
