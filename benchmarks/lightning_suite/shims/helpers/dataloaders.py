"""Loader-like iterables without a usable ``len`` (Lightning's test helpers, re-made)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class CustomInfDataloader:
    """Iterates a DataLoader over and over, 50 batches per pass, and has no ``__len__``."""

    limit = 50

    def __init__(self, dataloader: Any) -> None:
        self.dataloader = dataloader
        self.dataloader.num_workers = 0
        self._it = iter(dataloader)
        self.count = 0

    def __iter__(self) -> Iterator[Any]:
        self.count = 0
        return self

    def __next__(self) -> Any:
        if self.count >= self.limit:
            raise StopIteration
        self.count += 1
        try:
            return next(self._it)
        except StopIteration:  # start the wrapped loader over
            self._it = iter(self.dataloader)
            return next(self._it)


class CustomNotImplementedErrorDataloader(CustomInfDataloader):
    """Two batches per pass; ``len()`` raises NotImplementedError."""

    limit = 2

    def __len__(self) -> int:
        raise NotImplementedError
