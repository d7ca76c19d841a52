"""``pytorch_lightning.utilities.rank_zero`` after the rename: run or print on global rank 0 only."""
from trainer.strategies.rank import rank_zero_info, rank_zero_only, rank_zero_warn

__all__ = ["rank_zero_info", "rank_zero_only", "rank_zero_warn"]
