"""Where batches come from: each stage's dataloaders and their limits, distributed samplers, several training
loaders combined (``CombinedLoader``), and the module's batch-transfer hooks around the move to the device.
Exact mid-epoch positions are the checkpoint package's (``trainer.checkpoint.data_position``)."""
from trainer.data.combined_loader import CombinedLoader

__all__ = ["CombinedLoader"]
