"""Lightning's ``pytorch_lightning.core.datamodule`` after the rename (``trainer.core.datamodule``): the data module
base class, under our name and Lightning's (the rename turns ``LightningDataModule`` into ``DataModule``)."""
from trainer.module.datamodule import DataModule

LightningDataModule = DataModule

__all__ = ["DataModule", "LightningDataModule"]
