"""``pytorch_lightning.core.optimizer.LightningOptimizer`` after the rename: the optimizer wrapper that
``self.optimizers()`` returns in manual optimisation (ours is ``ManualOptimizer``)."""
from trainer.loops.optimization import ManualOptimizer as LightningOptimizer

__all__ = ["LightningOptimizer"]
