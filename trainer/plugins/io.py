"""``pytorch_lightning.plugins.io`` after the rename: ``TorchCheckpointIO`` is our ``CheckpointIO`` (atomic
writes, reads with ``weights_only=True``)."""
from trainer.strategies.checkpoint.checkpoint_io import CheckpointIO
from trainer.strategies.checkpoint.checkpoint_io import CheckpointIO as TorchCheckpointIO

__all__ = ["CheckpointIO", "TorchCheckpointIO"]
