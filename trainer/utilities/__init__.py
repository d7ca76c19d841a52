"""Lightning's ``pytorch_lightning.utilities`` names after the rename (``trainer.utilities``): aliases of ours."""
from trainer.data.combined_loader import CombinedLoader
from trainer.module.hparams import AttributeDict
from trainer.strategies.rank import rank_zero_info, rank_zero_only, rank_zero_warn
from trainer.strategies.strategy import move_to_device as move_data_to_device
from trainer.utilities.grad_norm import grad_norm



def rank_zero_deprecation(message: str, stacklevel: int = 4) -> None:
    """A ``DeprecationWarning`` from global rank 0 only."""
    rank_zero_warn(message, category=DeprecationWarning, stacklevel=stacklevel)


__all__ = [
    "AttributeDict",
    "CombinedLoader",
    "grad_norm",
    "move_data_to_device",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]
