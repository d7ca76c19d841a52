"""Lightning's ``pytorch_lightning.core.module`` after the rename (``trainer.core.module``): the module base class,
under our name and Lightning's (the rename turns ``LightningModule`` into ``TrainModule``; both import here)."""
from trainer.module.train_module import TrainModule

LightningModule = TrainModule

__all__ = ["LightningModule", "TrainModule"]
