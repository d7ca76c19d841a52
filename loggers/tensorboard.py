"""Lightning's ``pytorch_lightning.loggers.tensorboard`` after the rename (``trainer.loggers.tensorboard``): ported
imports and ``mock.patch("...loggers.tensorboard.TensorBoardLogger...")`` paths find the logger here."""
from trainer.loggers.tensorboard_logger import TensorBoardLogger

__all__ = ["TensorBoardLogger"]
