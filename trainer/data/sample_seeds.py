"""Per-sample random streams: each sample's ``torch``, ``random`` and ``numpy`` global generators are seeded from
(run seed, epoch, sample index) just before ``dataset[index]`` runs.

Random augmentation drawn inside ``__getitem__`` then depends only on which sample is loaded, never on which
worker or rank loads it or on what that worker loaded before, so a fit resumed mid-epoch (another worker count,
another world size) draws exactly what the uninterrupted fit drew. The user's dataset is left as it is: while
an epoch's iterator is created the training loader reads it through :class:`SeededDataset`, and its index
sampler hands out :class:`SampleKeys` (the indices with the epoch's seed attached), which travel to the
workers with the indices themselves, so persistent workers follow every epoch.

Only worker processes seed per sample. With ``num_workers=0`` the dataset draws from the training's own global
stream, which checkpoints save and restore, so that resume is exact already at no cost; seeding there would also
cost the main process about 10 µs per sample, which a tiny model's step would notice (benchmarks/data_resume.py).
"""
from __future__ import annotations

import random
import sys
import zlib
from typing import Any

import torch
from torch.utils.data import Dataset, get_worker_info

_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """SplitMix64's finaliser: a cheap 64-bit hash whose outputs for nearby inputs are unrelated."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def epoch_seed(run_seed: int, epoch: int) -> int:
    """The seed every sample of ``epoch`` derives its own from."""
    return _mix(_mix(run_seed & _MASK) ^ epoch)


def sample_seed(epoch_base: int, index: Any) -> int:
    """The seed of the sample at ``index`` (an int, or any index whose ``repr`` is stable) in an epoch."""
    key = index if isinstance(index, int) else zlib.crc32(repr(index).encode())
    return _mix(epoch_base ^ _mix(key & _MASK))


def seed_sample(seed: int) -> None:
    """Seed the CPU ``torch``, ``random`` and (when imported) ``numpy`` global generators with ``seed``."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed & 0xFFFFFFFF)


class SampleKeys(list):
    """A batch of indices with the seed of their epoch (a list, so samplers' batches pickle to workers as is)."""

    def __init__(self, indices: Any, base: int) -> None:
        super().__init__(indices)
        self.base = base


class SampleKey:
    """One index with the seed of its epoch (a loader with ``batch_size=None`` fetches sample by sample)."""

    __slots__ = ("index", "base")

    def __init__(self, index: Any, base: int) -> None:
        self.index = index
        self.base = base

    def __reduce__(self) -> Any:
        return SampleKey, (self.index, self.base)


class SeededDataset(Dataset):
    """Reads ``dataset`` with each sample's generators seeded first (for :class:`SampleKeys` and
    :class:`SampleKey`); any other index reads ``dataset`` untouched. Attributes are the dataset's."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):  # unpickling in a worker looks these up before __init__
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # A worker_init_fn that opens a per-worker handle on get_worker_info().dataset sets it on the user's dataset.
        if name == "dataset":
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, SampleKey):
            return self.dataset[index]
        if get_worker_info() is not None:
            seed_sample(sample_seed(index.base, index.index))
        return self.dataset[index.index]

    def __getitems__(self, indices: Any) -> list[Any]:
        dataset = self.dataset
        if not isinstance(indices, SampleKeys):
            getitems = getattr(dataset, "__getitems__", None)
            return getitems(indices) if getitems is not None else [dataset[i] for i in indices]
        if get_worker_info() is None:  # the main process: the training's stream, saved in checkpoints
            return [dataset[index] for index in indices]
        base = indices.base
        samples = []
        for index in indices:
            seed_sample(sample_seed(base, index))
            samples.append(dataset[index])
        return samples
