"""What users subclass: ``TrainModule`` (a ``torch.nn.Module`` with the steps, hooks and ``self.log``) and
``DataModule``; their hyperparameters, the optimizer wrappers a module sees, its collectives, and rebuilding a
module from a checkpoint file. Knows nothing of the Trainer beyond the object it is attached to."""
from trainer.module.datamodule import DataModule
from trainer.module.train_module import TrainModule

__all__ = ["DataModule", "TrainModule"]
