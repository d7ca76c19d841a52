"""``pytorch_lightning.utilities.combined_loader`` after the rename: the module path ported code imports
``CombinedLoader`` from (ours lives in ``trainer.data.combined_loader``; also ``trainer.CombinedLoader``)."""
from trainer.data.combined_loader import CombinedLoader

__all__ = ["CombinedLoader"]
