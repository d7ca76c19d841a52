"""``pytorch_lightning.utilities.exceptions`` after the rename. ``MisconfigurationException`` is our
``ConfigurationError`` (the same class, so ``except MisconfigurationException`` catches ours)."""
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.errors import ConfigurationError as MisconfigurationException

__all__ = ["ConfigurationError", "MisconfigurationException"]
