"""Lightning's ``pytorch_lightning.plugins`` names after the rename (``trainer.plugins``): the precision plugins,
checkpoint IO and layer syncs a ported script passes as ``Trainer(plugins=[...])``, re-exported from where they
live (``trainer.strategies``). ``TorchCheckpointIO`` is our ``CheckpointIO``."""
from trainer.plugins.environments import ClusterEnvironment, LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment
from trainer.plugins.io import CheckpointIO, TorchCheckpointIO
from trainer.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from trainer.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

__all__ = [
    "CheckpointIO",
    "ClusterEnvironment",
    "DoublePrecision",
    "HalfPrecision",
    "LayerSync",
    "LightningEnvironment",
    "MixedPrecision",
    "Precision",
    "SLURMEnvironment",
    "TorchCheckpointIO",
    "TorchElasticEnvironment",
    "TorchSyncBatchNorm",
]
