"""Lightning's ``Tuner`` (``pytorch_lightning.tuner.Tuner`` after the rename): ``lr_find`` and
``scale_batch_size`` before a fit, built on the ``LearningRateFinder`` and ``BatchSizeFinder`` callbacks."""
from trainer.tuner.tuning import Tuner

__all__ = ["Tuner"]
