"""Accelerate's data split: whole batches of the original loader dealt to the processes in turn, or each batch
cut into one piece per process (``split_batches``). The Engine's prepared dataloaders use it, so a loop gets the
batches, and from them the numbers, that Accelerate gives it.

On ``range(12)`` with batch 2 and 2 processes, process 0 reads ``[0, 1], [4, 5], [8, 9]`` and process 1
``[2, 3], [6, 7], [10, 11]``. When the batches do not divide evenly, ``even_batches=True`` completes the last round
with the first samples again, so every process runs equally many full batches; ``even_batches=False`` leaves the
last processes one batch fewer (and the last batch short). ``drop_last=True`` drops an incomplete round.

The original sampler (sequential, or shuffled by its own generator) draws the order; the loader is rebuilt
around :class:`BatchShard` with the original batch sampler inside it, so the resume machinery of
:mod:`trainer.checkpoint.data_position` positions it like any DataLoader.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from trainer.strategies.errors import ConfigurationError

# DataLoader settings copied to the rebuilt loader (those this torch version knows).
_LOADER_SETTINGS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)  # fmt: skip


class BatchShard(BatchSampler):
    """The index batches of process ``rank`` out of ``num_processes``, from ``batch_sampler``'s batches."""

    def __init__(self, batch_sampler: Any, num_processes: int, rank: int, split_batches: bool = False,
                 even_batches: bool = True) -> None:  # fmt: skip
        # No BatchSampler.__init__: the indices come from ``batch_sampler``.
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.rank = rank
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: Optional[int] = getattr(batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        if split_batches and (self.batch_size is None or self.batch_size % num_processes):
            raise ConfigurationError(
                f"split_batches=True cuts each batch into {num_processes} equal pieces, but the batch size is "
                f"{self.batch_size}. Use a batch size divisible by {num_processes}, or split_batches=False."
            )

    @property
    def num_replicas(self) -> int:
        """The process count (the name a distributed sampler gives it: a resume checks the split is the same)."""
        return self.num_processes

    @property
    def sampler(self) -> Any:
        """The original sampler (its generator is saved with a checkpoint's data position)."""
        return getattr(self.batch_sampler, "sampler", None)

    def __len__(self) -> int:
        total, processes = len(self.batch_sampler), self.num_processes
        if self.split_batches:
            return total - self._misses_last_piece()
        if total % processes == 0:
            return total // processes
        if self.drop_last:
            return total // processes
        if self.even_batches:
            return total // processes + 1
        return total // processes + (self.rank < total % processes)

    def _misses_last_piece(self) -> int:
        """1 when ``even_batches=False`` leaves this process without a piece of a short last batch (Accelerate
        counts that piece in ``len`` anyway; an honest length lets the last accumulation window end on time)."""
        if self.drop_last or self.even_batches:
            return 0
        try:
            samples = len(self.batch_sampler.sampler)
        except (AttributeError, TypeError):
            return 0
        short = samples % self.batch_size
        return int(0 < short <= self.batch_size // self.num_processes * self.rank)

    def __iter__(self) -> Iterator[list[Any]]:
        return self._pieces() if self.split_batches else self._dealt()

    def _pieces(self) -> Iterator[list[Any]]:
        size = self.batch_size
        piece = size // self.num_processes
        start, stop = piece * self.rank, piece * (self.rank + 1)
        first: list[Any] = []
        batch: list[Any] = []
        for index, batch in enumerate(self.batch_sampler):
            if index == 0:
                first = list(batch)
            if len(batch) == size:
                yield batch[start:stop]
        if self.drop_last or not first or len(batch) == size:
            return
        if not self.even_batches:
            if len(batch) > start:
                yield batch[start:stop]
            return
        while len(first) < size:  # fewer samples than one batch
            first += first
        yield (list(batch) + first)[start:stop]

    def _dealt(self) -> Iterator[list[Any]]:
        processes, rank, size = self.num_processes, self.rank, self.batch_size
        first: list[Any] = []  # the first round's samples (or batches, without a batch size), to complete the last
        mine: Optional[list[Any]] = None  # this process's batch of the current round
        batch: list[Any] = []
        index = -1
        for index, batch in enumerate(self.batch_sampler):
            if not self.drop_last and index < processes:
                first.append(batch) if size is None else first.extend(batch)
            if index % processes == rank:
                mine = batch
            # A round is yielded once complete, and only if its last batch is full (else every process pads).
            if index % processes == processes - 1 and (size is None or len(batch) == size):
                yield mine
                mine = None
        if self.drop_last or not first:
            return
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine and (size is None or len(mine) == size):
            yield mine
        needed = processes * size if size is not None else processes
        while len(first) < needed:
            first += first
        if size is None or len(batch) == size:  # the last batch was yielded: pad from the next slot on
            batch, index = [], index + 1
        else:
            batch = list(batch)
        cursor = 0
        while index % processes or batch:
            if size is None:
                batch = first[cursor]
                cursor += 1
            else:
                end = cursor + size - len(batch)
                batch = batch + first[cursor:end]
                cursor = end
            if index % processes == rank:
                yield batch
            batch, index = [], index + 1


def total_batch_size(loader: Any) -> Optional[int]:
    """Samples per step over all processes of a loader :func:`deal_batches` built (the batch size when it splits
    batches, times the process count when it deals them); None for other loaders."""
    shard = getattr(loader, "batch_sampler", None)
    if not isinstance(shard, BatchShard) or shard.batch_size is None:
        return getattr(loader, "batch_size", None)
    return shard.batch_size if shard.split_batches else shard.batch_size * shard.num_processes


def deal_batches(loader: DataLoader, num_processes: int, rank: int, split_batches: bool, even_batches: bool) -> Any:
    """A copy of ``loader`` yielding process ``rank``'s batches (see the module docstring); ``loader`` itself
    with one process. A shuffled loader without a generator gets one, seeded from the global torch RNG (the same
    on every process after a common seed), so every process draws the same order."""
    if num_processes == 1 or isinstance(loader.dataset, IterableDataset):
        if isinstance(loader.dataset, IterableDataset) and num_processes > 1:
            raise ConfigurationError(
                "prepare() cannot split a DataLoader over an IterableDataset across processes: make the dataset "
                "yield each process's share itself (by torch.distributed.get_rank()) and pass "
                "use_distributed_sampler=False."
            )
        return loader
    sampler = loader.sampler
    if hasattr(sampler, "generator") and sampler.generator is None:
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    batch_sampler = loader.batch_sampler if loader.batch_sampler is not None else sampler
    if loader.batch_sampler is None and not isinstance(sampler, BatchSampler):
        raise ConfigurationError(
            f"prepare() deals whole batches to the processes, but the DataLoader has batch_size=None and a "
            f"{type(batch_sampler).__name__} sampler. Give it a batch_size or a batch_sampler."
        )
    shard = BatchShard(batch_sampler, num_processes, rank, split_batches, even_batches)
    settings = {name: getattr(loader, name) for name in _LOADER_SETTINGS if hasattr(loader, name)}
    if not settings.get("num_workers"):
        settings["prefetch_factor"] = None
    settings["multiprocessing_context"] = loader.multiprocessing_context
    try:
        if loader.batch_sampler is None:  # the sampler itself yields batches (batch_size=None)
            return type(loader)(loader.dataset, batch_size=None, sampler=shard, **settings)
        return type(loader)(loader.dataset, batch_sampler=shard, **settings)
    except TypeError as err:
        raise ConfigurationError(
            f"Could not rebuild {type(loader).__name__} around this process's batches ({err}). Pass "
            "use_distributed_sampler=False and give each process its own share of the data."
        ) from None
