"""Splitting dataloaders across ranks, and keeping the ranks' training batch counts equal.

Training: a ``DistributedSampler`` that keeps the loader's order. A sequential loader stays sequential
(rank r takes samples r, r+W, r+2W, ..., so W ranks with batch b see exactly the batches of one process
with batch W*b); a shuffled one shuffles with the same seed on every rank and reshuffles each epoch
(``set_epoch``); ``drop_last=True`` drops the tail instead of padding it. Evaluation: every sample exactly
once (no padding), so the ranks' epoch metrics, reduced with ``sync_dist=True``, match one process.
"""
from __future__ import annotations

import math
import os
from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_warn

# DataLoader settings copied to the rebuilt loader (those this torch version knows).
_LOADER_SETTINGS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)  # fmt: skip


class EvaluationDistributedSampler(DistributedSampler):
    """Rank r takes samples r, r+W, ... with no padding: ranks may get one sample fewer, none is counted twice."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int, shuffle: bool = False, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.total_size = len(dataset)
        self.num_samples = len(range(rank, self.total_size, num_replicas))

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.total_size, generator=generator).tolist()
        else:
            indices = range(self.total_size)
        return iter(indices[self.rank :: self.num_replicas])


def _shuffles(loader: DataLoader) -> bool:
    """True for ``shuffle=True``, False for sequential order; anything else cannot be split safely here."""
    sampler = loader.sampler
    if type(sampler) is SequentialSampler:
        return False
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        return True
    raise ConfigurationError(
        f"The dataloader uses a custom sampler ({type(sampler).__name__}), which cannot be split across ranks "
        "automatically without changing what it samples. Make it rank-aware (e.g. wrap it in a "
        "torch.utils.data.DistributedSampler-style sampler that yields this rank's share) and pass "
        "use_distributed_sampler=False to the Trainer or Engine."
    )


def _seed(loader: DataLoader) -> int:
    """The same seed on every rank: the loader's generator's, else the one seed_everything exported, else 0."""
    if loader.generator is not None:
        return loader.generator.initial_seed()
    return int(os.environ.get("TRAINER_SEED", 0))


def distribute_loader(loader: DataLoader, sampler_kwargs: dict[str, int], training: bool) -> DataLoader:
    """A copy of ``loader`` that yields only this rank's share (``sampler_kwargs``: ``num_replicas``, ``rank``).

    Left untouched: loaders that already use a ``DistributedSampler`` and iterable datasets (which
    must shard themselves, e.g. by ``torch.utils.data.get_worker_info()`` and the rank).
    """
    if isinstance(loader.sampler, DistributedSampler) or isinstance(loader.dataset, IterableDataset):
        return loader
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        raise ConfigurationError(
            f"The dataloader uses a custom batch_sampler ({type(batch_sampler).__name__}), which cannot be split "
            "across ranks automatically. Give each rank its own share of the batches and pass "
            "use_distributed_sampler=False to the Trainer or Engine."
        )
    shuffle = _shuffles(loader)
    if training:
        sampler: DistributedSampler = DistributedSampler(
            loader.dataset, shuffle=shuffle, seed=_seed(loader), drop_last=loader.drop_last, **sampler_kwargs
        )
    else:
        sampler = EvaluationDistributedSampler(loader.dataset, shuffle=shuffle, seed=_seed(loader), **sampler_kwargs)
    return _rebuilt(loader, sampler, "Pass use_distributed_sampler=False to the Trainer or Engine and give it a "
                                     "DistributedSampler yourself.")  # fmt: skip


def _rebuilt(loader: DataLoader, sampler: Any, advice: str) -> DataLoader:
    """A copy of ``loader`` (same settings) drawing its indices from ``sampler``."""
    settings = {name: getattr(loader, name) for name in _LOADER_SETTINGS if hasattr(loader, name)}
    if not settings.get("num_workers"):
        settings["prefetch_factor"] = None
    settings["multiprocessing_context"] = loader.multiprocessing_context
    try:
        return type(loader)(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                            drop_last=loader.drop_last, **settings)  # fmt: skip
    except TypeError as err:
        raise ConfigurationError(
            f"Could not rebuild {type(loader).__name__} with a {type(sampler).__name__} ({err}). {advice}"
        ) from None


def without_shuffle(loader: Any, role: str = "train") -> Any:
    """``overfit_batches``: a DataLoader whose sampler does not read in order (``shuffle=True`` or any other sampler
    than ``SequentialSampler``, as Lightning decides) rebuilt to read in order, so every epoch sees the same
    batches. ``role``: ``"train"`` or ``"val"``, as Lightning's warning names the loader."""
    if (not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset)
            or isinstance(loader.sampler, SequentialSampler) or type(loader.batch_sampler) not in (BatchSampler, type(None))):  # fmt: skip
        return loader
    rank_zero_warn(f"overfit_batches: you requested to overfit but enabled {role} dataloader shuffling (its sampler is "
                   f"a {type(loader.sampler).__name__}); it reads in order instead, so every epoch sees the same "
                   "batches.")  # fmt: skip
    return _rebuilt(loader, SequentialSampler(loader.dataset), "Pass a DataLoader with shuffle=False.")


def balance_training_batches(reduce: Any, num_batches: float) -> float:
    """The number of training batches every rank runs: the smallest across ranks (one collective per fit).

    Ranks running different numbers of batches would wait for each other's gradient all-reduce forever;
    this trims the longer ones and warns. Loaders without a length cannot be checked: their ranks must
    yield equally many batches.
    """
    counts = torch.tensor([num_batches, -num_batches], dtype=torch.float64)
    high, neg_low = reduce(counts, "max").tolist()
    low = -neg_low
    if high == low:
        if math.isinf(high):
            rank_zero_warn(
                "The training data has no length (an IterableDataset?), so the Trainer cannot check that every "
                "rank runs the same number of batches. Make every rank yield the same number, or set "
                "limit_train_batches to a number every rank reaches; a rank that runs out early leaves the others "
                "waiting until the process-group timeout."
            )
        return num_batches
    rank_zero_warn(
        f"The ranks have different numbers of training batches per epoch (from {low:g} to {high:g}); every rank "
        f"runs {low:g} so that none waits for the others forever. Use the distributed sampler "
        "(use_distributed_sampler=True) or give every rank an equal share."
    )
    return min(num_batches, int(low))
