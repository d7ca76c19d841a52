"""Mid-epoch resume through a dataset's own ``state_dict()``: an ``IterableDataset`` that records where it stands
(``datasets.IterableDataset``, torchdata's nodes) continues from there instead of reading the finished batches
again.

Applies to a ``DataLoader`` that loads in this process (``num_workers=0``: the dataset object the loader iterates
is this one, so its ``state_dict()`` is the loader's position) over a dataset with ``state_dict()`` and
``load_state_dict()``. The epoch loop may read one batch ahead of the step it runs, so the dataset's state is
recorded after each batch the iterator hands out, and a checkpoint keeps the last two with their batch counts: the
resume picks the one matching the batches the loop finished. Every rank keeps its own (its dataset may read
its own shard): :mod:`trainer.checkpoint.data_position` gathers them into one entry per rank.
"""
from __future__ import annotations

import copy
from typing import Any, Iterator, Optional

from torch.utils.data import DataLoader, IterableDataset


def _resumable(loader: Any) -> Optional[Any]:
    """The loader's dataset when it can be positioned through its own state, else ``None``."""
    if not isinstance(loader, DataLoader) or type(loader).__iter__ is not DataLoader.__iter__:
        return None
    dataset = loader.dataset
    if not isinstance(dataset, IterableDataset) or loader.num_workers != 0:
        return None
    if callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None)):
        return dataset
    return None


class DatasetState:
    """Each epoch's iterator over a resumable dataset, and the dataset states a checkpoint needs."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._states: list[tuple[int, Any]] = []  # (batches handed out, the dataset's state then), the last two

    @classmethod
    def of(cls, loader: Any) -> Optional["DatasetState"]:
        """A tracker for ``loader`` when its dataset holds its own position, else ``None``."""
        dataset = _resumable(loader)
        return cls(dataset) if dataset is not None else None

    def can_resume(self, skip: int, saved: Optional[dict[str, Any]]) -> bool:
        """Whether ``saved`` (this class's :meth:`state_dict`) has the dataset's state after ``skip`` batches."""
        return bool(saved) and any(count == skip for count, _ in saved.get("states", ()))

    def iterator(self, loader: DataLoader, skip: int, saved: Optional[dict[str, Any]]) -> Iterator[Any]:
        """The epoch's batches; resumed after ``skip`` batches from the state ``saved`` holds for that count."""
        start = 0
        if skip:
            state = next(s for count, s in saved["states"] if count == skip)
            self.dataset.load_state_dict(copy.deepcopy(state))
            start = skip
        self._states = [(start, copy.deepcopy(self.dataset.state_dict()))]
        return self._tracked(iter(loader), start)

    def _tracked(self, batches: Iterator[Any], count: int) -> Iterator[Any]:
        for batch in batches:
            count += 1
            self._states = [self._states[-1], (count, copy.deepcopy(self.dataset.state_dict()))]
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The dataset's states after the last two batches handed out, with their counts."""
        return {"states": list(self._states)}
