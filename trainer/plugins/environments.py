"""``pytorch_lightning.plugins.environments`` after the rename. ``LightningEnvironment`` (processes started by the
Trainer's own launcher) is our ``LocalEnvironment``. ``KubeflowEnvironment`` also handles several processes per
pod (Lightning's assumes one, Lightning #13374) and is detected without being passed."""
from trainer.strategies.launch.environments import ClusterEnvironment, KubeflowEnvironment, SLURMEnvironment, TorchElasticEnvironment
from trainer.strategies.launch.environments import LocalEnvironment as LightningEnvironment

__all__ = ["ClusterEnvironment", "KubeflowEnvironment", "LightningEnvironment", "SLURMEnvironment", "TorchElasticEnvironment"]
