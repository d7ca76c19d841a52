"""``pytorch_lightning.utilities.data`` after the rename: what a Lightning user calls of it on a dataloader."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import IterableDataset

from trainer.data.loaders import loader_length
from trainer.strategies.rank import rank_zero_warn


def has_iterable_dataset(dataloader: Any) -> bool:
    """Whether ``dataloader`` reads an ``IterableDataset`` (Lightning's helper of this name)."""
    return isinstance(getattr(dataloader, "dataset", None), IterableDataset)


def has_len_all_ranks(dataloader: Any, strategy: Any, allow_zero_length_dataloader_with_multiple_devices: bool = False
                      ) -> bool:  # fmt: skip
    """Whether ``dataloader`` has a length (``len()``) on every rank, as Lightning's helper of this name answers.

    Warns when the lengths of all ranks add up to zero, and when a loader over an ``IterableDataset`` defines a
    length (with several workers it may not match what the workers yield). A rank whose loader is empty while
    others' are not is an error, unless ``allow_zero_length_dataloader_with_multiple_devices`` (then a warning).
    """
    length = loader_length(dataloader)
    if math.isinf(length):
        return False
    total = int(strategy.reduce(torch.tensor(int(length), device=strategy.root_device), op="sum"))
    name = type(dataloader).__name__
    if total == 0:
        rank_zero_warn(f"Total length of `{name}` across ranks is zero. Please make sure this was your intention.")
    elif length == 0:
        if not allow_zero_length_dataloader_with_multiple_devices:
            raise RuntimeError(f"`{name}` within local rank has zero length. Please make sure that it returns at "
                               "least 1 batch.")  # fmt: skip
        rank_zero_warn(f"Total length of `{name}` across ranks is not zero, but local rank has zero length. Please "
                       "be cautious of uneven batch length.")  # fmt: skip
    if has_iterable_dataset(dataloader):
        rank_zero_warn("Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading "
                       "(when num_workers > 1), `__len__` could be inaccurate if each worker is not configured "
                       "independently to avoid having duplicate data.")  # fmt: skip
    return True


__all__ = ["has_iterable_dataset", "has_len_all_ranks"]
