"""``pytorch_lightning.plugins.environments`` after the rename. ``LightningEnvironment`` (processes started by the
Trainer's own launcher) is our ``LocalEnvironment``."""
from trainer.strategies.launch.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment
from trainer.strategies.launch.environments import LocalEnvironment as LightningEnvironment

__all__ = ["ClusterEnvironment", "LightningEnvironment", "SLURMEnvironment", "TorchElasticEnvironment"]
