"""``pytorch_lightning.core.optimizer.LightningOptimizer`` after the rename: the optimizer wrapper that
``self.optimizers()`` returns, in automatic and in manual optimisation (ours is ``OptimizerWrapper``)."""
from trainer.loops.optimization import OptimizerWrapper as LightningOptimizer

__all__ = ["LightningOptimizer"]
