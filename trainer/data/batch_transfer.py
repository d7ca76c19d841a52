"""Moving a batch to the device, with the Lightning transfer hooks the datamodule or the module overrides (the
datamodule's first, as in Lightning): ``on_before_batch_transfer(batch, dataloader_idx)`` →
``transfer_batch_to_device(batch, device, dataloader_idx)`` → the strategy's move and precision conversion →
``on_after_batch_transfer(batch, dataloader_idx)``.

Resolved once per epoch and dataloader: a module without these hooks gets ``strategy.batch_to_device`` itself,
or ``None`` (nothing to call) where the strategy leaves batches as they are.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from trainer.module.datamodule import DataModule
from trainer.module.overrides import implements, overrides
from trainer.module.train_module import TrainModule


def _hook(trainer: Any, name: str) -> Optional[Callable[..., Any]]:
    """The datamodule's ``name`` where it overrides it, else the module's where it does, else ``None``."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and implements(datamodule, DataModule, name):  # Lightning's rule for the choice
        return getattr(datamodule, name)
    return getattr(trainer.module, name) if overrides(trainer.module, TrainModule, name) else None


def batch_mover(trainer: Any, dataloader_idx: int = 0) -> Optional[Callable[[Any], Any]]:
    """The function the loops call on each batch before the step; ``None`` when there is nothing to do."""
    strategy = trainer.strategy
    before, transfer, after = (_hook(trainer, name) for name in
                               ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"))  # fmt: skip
    if not (before or transfer or after):
        return strategy.batch_to_device if strategy.moves_batches else None

    def move(batch: Any) -> Any:
        if before is not None:
            batch = before(batch, dataloader_idx)
        if transfer is not None:
            batch = transfer(batch, strategy.root_device, dataloader_idx)
        batch = strategy.batch_to_device(batch)  # tensors already there are not copied again
        if after is not None:
            batch = after(batch, dataloader_idx)
        return batch

    return move
