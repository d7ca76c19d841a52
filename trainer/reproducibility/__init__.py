"""Random state: ``seed_everything``, capturing and restoring every generator a checkpoint records, and
running something (the sanity check, a finder's trial) without changing the random numbers that follow."""
from trainer.reproducibility.seed import seed_everything

__all__ = ["seed_everything"]
