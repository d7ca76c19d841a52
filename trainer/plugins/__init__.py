"""Lightning's ``pytorch_lightning.plugins`` names after the rename (``trainer.plugins``): the precision plugins,
checkpoint IO and layer syncs a ported script passes as ``Trainer(plugins=[...])``, re-exported from where they
live (``trainer.strategies``). ``TorchCheckpointIO`` is our ``CheckpointIO``."""
from typing import Any

from trainer.plugins.io import CheckpointIO, TorchCheckpointIO
from trainer.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from trainer.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

_ENVIRONMENTS = ("ClusterEnvironment", "LightningEnvironment", "SLURMEnvironment", "TorchElasticEnvironment")

__all__ = [
    "CheckpointIO",
    "DoublePrecision",
    "HalfPrecision",
    "LayerSync",
    "MixedPrecision",
    "Precision",
    "TorchCheckpointIO",
    "TorchSyncBatchNorm",
    *_ENVIRONMENTS,
]


def __getattr__(name: str) -> Any:
    if name in _ENVIRONMENTS:  # imported on first use: `import trainer` does not load the cluster environments
        from trainer.plugins import environments

        return getattr(environments, name)
    raise AttributeError(f"module 'trainer.plugins' has no attribute {name!r}")
