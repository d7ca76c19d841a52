"""``pytorch_lightning.core.datamodule`` after the rename: where ported code imports ``LightningDataModule`` from
(our ``DataModule``; both names are exported, as the rename turns one into the other)."""
from trainer.module.datamodule import DataModule
from trainer.module.datamodule import DataModule as LightningDataModule

__all__ = ["DataModule", "LightningDataModule"]
