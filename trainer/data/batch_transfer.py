"""Moving a batch to the device, with the module's Lightning transfer hooks where it overrides them:
``on_before_batch_transfer(batch, dataloader_idx)`` → ``transfer_batch_to_device(batch, device, dataloader_idx)``
→ the strategy's move and precision conversion → ``on_after_batch_transfer(batch, dataloader_idx)``.

Resolved once per epoch and dataloader: a module without these hooks gets ``strategy.batch_to_device`` itself,
or ``None`` (nothing to call) where the strategy leaves batches as they are.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from trainer.module.overrides import overrides
from trainer.module.train_module import TrainModule


def batch_mover(trainer: Any, dataloader_idx: int = 0) -> Optional[Callable[[Any], Any]]:
    """The function the loops call on each batch before the step; ``None`` when there is nothing to do."""
    module, strategy = trainer.module, trainer.strategy
    before, transfer, after = (overrides(module, TrainModule, name) for name in
                               ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"))  # fmt: skip
    if not (before or transfer or after):
        return strategy.batch_to_device if strategy.moves_batches else None

    def move(batch: Any) -> Any:
        if before:
            batch = module.on_before_batch_transfer(batch, dataloader_idx)
        if transfer:
            batch = module.transfer_batch_to_device(batch, strategy.root_device, dataloader_idx)
        batch = strategy.batch_to_device(batch)  # tensors already there are not copied again
        if after:
            batch = module.on_after_batch_transfer(batch, dataloader_idx)
        return batch

    return move
