"""Lightning's ``pytorch_lightning.core`` names after the rename (``trainer.core``): aliases of ours, for ported
imports. ``LightningModule`` is ``TrainModule``, ``LightningDataModule`` is ``DataModule``."""
from trainer.module.datamodule import DataModule as LightningDataModule
from trainer.module.train_module import TrainModule as LightningModule

__all__ = ["LightningDataModule", "LightningModule"]
