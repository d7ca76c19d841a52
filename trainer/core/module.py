"""``pytorch_lightning.core.module`` after the rename: where ported code imports ``LightningModule`` from
(our ``TrainModule``; both names are exported, as the rename turns one into the other)."""
from trainer.module.train_module import TrainModule
from trainer.module.train_module import TrainModule as LightningModule

__all__ = ["LightningModule", "TrainModule"]
