"""Resuming mid-epoch: the sampler is positioned, so no sample is loaded twice, skipped, or loaded to be dropped."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from trainer.callbacks import ModelCheckpoint

from ckpt_support import TinyRegressor, make_trainer, same_weights
from helpers import Crash


class Recorded(Dataset):
    """20 samples; remembers every index it was asked for."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(5)
        self.x, self.y = torch.randn(20, 6, generator=generator), torch.randn(20, 1, generator=generator)
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> Any:
        self.loaded.append(index)
        return self.x[index], self.y[index]


class Streamed(IterableDataset):
    def __init__(self) -> None:
        self.data = Recorded()

    def __iter__(self):
        order = torch.randperm(20).tolist()  # draws from the global RNG, like random augmentation would
        return (self.data[i] for i in order)


def run(root: Path, make_loader, crash_after: int = 0, resume: bool = False, **kwargs) -> tuple[TinyRegressor, Any]:
    torch.manual_seed(0)
    loader = make_loader()
    module = TinyRegressor()
    callbacks = []
    if kwargs.get("enable_checkpointing", True):
        callbacks.append(ModelCheckpoint(dirpath=root / "ck", every_n_train_steps=1, save_last=True))
    if crash_after:
        callbacks.append(Crash(crash_after))
    trainer = make_trainer(root, callbacks=callbacks, max_epochs=3, **kwargs)
    if crash_after:
        with pytest.raises(RuntimeError, match="simulated crash"):
            trainer.fit(module, loader)
    else:
        trainer.fit(module, loader, ckpt_path="last" if resume else None)
    return module, loader


def dataset_of(loader: DataLoader) -> Recorded:
    return loader.dataset.data if isinstance(loader.dataset, Streamed) else loader.dataset


LOADERS = {
    "shuffled": lambda: DataLoader(Recorded(), batch_size=4, shuffle=True),
    "own generator": lambda: DataLoader(Recorded(), batch_size=4, shuffle=True,
                                        generator=torch.Generator().manual_seed(7)),
    "distributed sampler": lambda: (lambda data: DataLoader(data, batch_size=2, sampler=DistributedSampler(
        data, num_replicas=2, rank=1, shuffle=True, seed=3)))(Recorded()),
    "no batch sampler": lambda: DataLoader(Recorded(), batch_size=None, shuffle=True),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(LOADERS))
def test_resumed_epoch_loads_exactly_the_remaining_samples(tmp_path: Path, kind: str) -> None:
    make_loader = LOADERS[kind]
    reference, reference_loader = run(tmp_path / "ref", make_loader)
    per_epoch = len(reference_loader)
    samples_per_batch = len(dataset_of(reference_loader).loaded) // (3 * per_epoch)
    crash_after = per_epoch + 2  # third batch of the second epoch
    run(tmp_path / "run", make_loader, crash_after=crash_after)
    resumed, loader = run(tmp_path / "run", make_loader, resume=True)
    expected = dataset_of(reference_loader).loaded[crash_after * samples_per_batch:]
    assert dataset_of(loader).loaded == expected  # nothing replayed, nothing skipped, nothing loaded to be dropped
    assert same_weights(reference, resumed)


def test_resuming_mid_epoch_with_a_different_data_split_warns(tmp_path: Path) -> None:
    def split(replicas: int):
        return lambda: DataLoader(Recorded(), batch_size=2, sampler=DistributedSampler(Recorded(), replicas, 0))

    run(tmp_path, split(2), crash_after=2)
    with pytest.warns(UserWarning, match="data split 2 ways, now 4"):
        run(tmp_path, split(4), resume=True)


def test_worker_processes_resume_exactly(tmp_path: Path) -> None:
    # Workers fetch indices ahead and a persistent iterator is reused across epochs; the order must still match.
    make_loader = lambda: DataLoader(Recorded(), batch_size=4, shuffle=True, num_workers=2,  # noqa: E731
                                     persistent_workers=True)  # fmt: skip
    reference, _ = run(tmp_path / "ref", make_loader)
    run(tmp_path / "run", make_loader, crash_after=7)
    resumed, _ = run(tmp_path / "run", make_loader, resume=True)
    assert same_weights(reference, resumed)


def test_iterable_dataset_is_replayed_to_its_position_and_still_exact(tmp_path: Path) -> None:
    make_loader = lambda: DataLoader(Streamed(), batch_size=4)  # noqa: E731
    reference, _ = run(tmp_path / "ref", make_loader)
    run(tmp_path / "run", make_loader, crash_after=7)
    with pytest.warns(UserWarning, match="the 2 finished batches are read again and dropped"):
        resumed, loader = run(tmp_path / "run", make_loader, resume=True)
    assert len(dataset_of(loader).loaded) == 2 * 20  # epoch 1 from its start (8 samples read again), epoch 2
    assert same_weights(reference, resumed)


def test_a_second_fit_with_more_steps_continues_the_epoch_where_the_first_stopped(tmp_path: Path) -> None:
    make_loader = LOADERS["shuffled"]
    _, reference_loader = run(tmp_path / "ref", make_loader, max_steps=10, enable_checkpointing=False)
    torch.manual_seed(0)
    loader, module = make_loader(), TinyRegressor()
    trainer = make_trainer(tmp_path, max_epochs=3, max_steps=7, enable_checkpointing=False)
    trainer.fit(module, loader)  # stops inside the second epoch
    trainer.max_steps = 10
    trainer.fit(module, loader)  # new optimizer state, but the data continues at the same batch
    assert trainer.global_step == 10
    assert loader.dataset.loaded == reference_loader.dataset.loaded
