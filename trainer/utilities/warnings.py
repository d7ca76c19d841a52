"""``pytorch_lightning.utilities.warnings`` after the rename (Lightning re-exports Fabric's class there):
``PossibleUserWarning``, the category of warnings that may be false positives."""
from trainer.strategies.rank import PossibleUserWarning

__all__ = ["PossibleUserWarning"]
