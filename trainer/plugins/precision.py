"""``pytorch_lightning.plugins.precision`` after the rename: the precision plugins (``trainer.strategies.precision``)."""
from trainer.strategies.precision.plugins import DoublePrecision, HalfPrecision, MixedPrecision, Precision

__all__ = ["DoublePrecision", "HalfPrecision", "MixedPrecision", "Precision"]
