"""Data that resumes exactly: random augmentation drawn in ``__getitem__`` by worker processes, another worker
count, another world size (see tests/scripts/augmented_fit.py: torch, random and numpy draws per sample,
shuffled, ``num_workers=2``, persistent workers; every step's loss written as ``float.hex``).

The runs are real subprocesses (DDP over gloo for several ranks); a killed run dies by ``os._exit`` at a step
mid-epoch, right after the checkpoint of the step before.
"""
from __future__ import annotations

import random
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler,
                              SequentialSampler, TensorDataset)

from ckpt_support import TinyRegressor, make_trainer, same_weights
from helpers import Crash
from trainer import Engine, TrainModule
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.data.epoch_order import order_record, rest_of_epoch

SCRIPT = Path(__file__).parent / "scripts" / "augmented_fit.py"
KILLED = 3


def blobs(n: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(n, 6, generator=generator), torch.randn(n, 1, generator=generator))


def fit(root: Path, *args: str, expect: int = 0) -> None:
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(root), str(root / "steps"), *args], capture_output=True,
                          text=True, timeout=150)  # fmt: skip
    assert proc.returncode == expect, proc.stderr[-3000:]


def steps(root: Path, rank: int = 0) -> list[str]:
    return (root / f"steps.rank{rank}").read_text().splitlines()


def epoch_indices(root: Path, ranks: int, epoch: int) -> Counter:
    found: Counter = Counter()
    for rank in range(ranks):
        for line in steps(root, rank):
            step_epoch, _, _, indices = line.split()
            if int(step_epoch) == epoch:
                found.update(int(i) for i in indices.split(","))
    return found


# ------------------------------------------------------------------------------------------ the epoch's order
CASES = {
    "sequential": lambda data: SequentialSampler(data),
    "shuffled": lambda data: RandomSampler(data),
    "own generator": lambda data: RandomSampler(data, generator=torch.Generator().manual_seed(3)),
    "distributed": lambda data: DistributedSampler(data, num_replicas=3, rank=1, shuffle=True, seed=4),
    "distributed drop_last": lambda data: DistributedSampler(data, num_replicas=3, rank=2, drop_last=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch_size", [None, 4])
def test_an_epoch_entered_at_its_position_continues_as_the_sampler_would(case: str, batch_size: int) -> None:
    data = list(range(23))
    sampler = CASES[case](data)
    if isinstance(sampler, DistributedSampler):
        sampler.set_epoch(2)
    index_sampler = BatchSampler(sampler, batch_size, drop_last=False) if batch_size else sampler
    generator = getattr(sampler, "generator", None)
    torch.manual_seed(11)
    record = order_record(index_sampler)
    expected = list(index_sampler)
    after = generator.get_state() if generator is not None else None
    global_after = torch.get_rng_state()
    skip = 2
    per_batch = batch_size or 1
    replicas = getattr(sampler, "num_replicas", 1)
    if generator is not None:
        generator.manual_seed(99)  # wherever the generator stands, the saved order is what is drawn
    torch.manual_seed(11)  # as resuming puts back the random state the epoch started from
    assert list(rest_of_epoch(record, skip * per_batch * replicas, index_sampler)) == expected[skip:]
    if generator is not None:
        assert torch.equal(generator.get_state(), after)  # the next epoch draws from where the uninterrupted one did
    assert torch.equal(torch.get_rng_state(), global_after)


# ------------------------------------------------------------------------------- killed and resumed, bitwise
@pytest.mark.timeout(400)  # four fits with two workers each (about 30 s on an idle 2-core machine)
def test_augmented_data_in_two_workers_resumes_bitwise_equal_also_with_one_worker(tmp_path: Path) -> None:
    fit(tmp_path / "reference")
    reference = steps(tmp_path / "reference")
    assert len(reference) == 16  # two epochs of 8 steps
    fit(tmp_path / "run", "--kill-batch", "11", expect=KILLED)  # mid-way through the second epoch
    shutil.copytree(tmp_path / "run", tmp_path / "one-worker")
    fit(tmp_path / "run", "--resume")
    assert steps(tmp_path / "run") == reference  # every step's batch and loss, bit for bit
    fit(tmp_path / "one-worker", "--resume", "--workers", "1")
    assert steps(tmp_path / "one-worker") == reference


def test_without_sample_seeds_the_augmentation_drawn_by_workers_differs_after_resume(tmp_path: Path) -> None:
    # The control: what the switch turns off is what makes the resume above exact.
    fit(tmp_path / "reference", "--no-sample-seeds", "--epochs", "1")
    fit(tmp_path / "run", "--kill-batch", "3", "--no-sample-seeds", "--epochs", "1", expect=KILLED)
    fit(tmp_path / "run", "--resume", "--no-sample-seeds", "--epochs", "1")
    assert steps(tmp_path / "run")[3:] != steps(tmp_path / "reference")[3:]


@pytest.fixture(scope="module")
def killed_at_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two DDP ranks, batch 4 each, killed at the second step of the second epoch (4 steps per epoch)."""
    root = tmp_path_factory.mktemp("two-ranks")
    fit(root, "--devices", "2", "--kill-batch", "6", expect=KILLED)
    return root


@pytest.mark.timeout(400)
def test_two_ranks_killed_mid_epoch_resume_bitwise_equal_with_one_worker_each(
    killed_at_two_ranks: Path, tmp_path: Path
) -> None:
    fit(tmp_path / "reference", "--devices", "2")
    shutil.copytree(killed_at_two_ranks, tmp_path / "run")
    fit(tmp_path / "run", "--devices", "2", "--resume", "--workers", "1")
    for rank in range(2):
        assert steps(tmp_path / "run", rank) == steps(tmp_path / "reference", rank)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [1, 4])
def test_saved_at_two_ranks_resumed_at_another_world_size_sees_every_sample_of_the_epoch_once(
    killed_at_two_ranks: Path, tmp_path: Path, ranks: int
) -> None:
    shutil.copytree(killed_at_two_ranks, tmp_path / "run")
    batch_size = 8 // ranks  # the same global batch
    fit(tmp_path / "run", "--resume", "--devices", str(ranks), "--batch-size", str(batch_size))
    seen = epoch_indices(tmp_path / "run", max(ranks, 2), epoch=1)
    assert seen == Counter(range(32))  # the 2 ranks' first 2 steps, then the rest dealt to the new ranks


# ------------------------------------------------------------------------------ loaders that keep their own state
class DictRegressor(TinyRegressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step((batch["x"], batch["y"]), batch_idx)


def fit_here(root: Path, make_loader: Callable[[], Any], module_class: type = TinyRegressor, crash_after: int = 0,
             resume: bool = False) -> TrainModule:  # fmt: skip
    torch.manual_seed(0)
    loader, module = make_loader(), module_class()
    callbacks: list[Callback] = [ModelCheckpoint(dirpath=root / "ck", every_n_train_steps=1, save_last=True)]
    if crash_after:
        callbacks.append(Crash(crash_after))
    trainer = make_trainer(root, callbacks=callbacks, max_epochs=2)
    if crash_after:
        with pytest.raises(RuntimeError, match="simulated crash"):
            trainer.fit(module, loader)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*read again and dropped.*")  # positioned, never replayed
            trainer.fit(module, loader, ckpt_path="last" if resume else None)
    return module


def test_torchdata_stateful_dataloader_resumes_from_its_own_state(tmp_path: Path) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (extra 'data')")

    def make_loader() -> Any:
        return stateful.StatefulDataLoader(blobs(24), batch_size=4, shuffle=True, num_workers=2)

    reference = fit_here(tmp_path / "ref", make_loader)
    fit_here(tmp_path / "run", make_loader, crash_after=8)  # the third batch of the second epoch
    assert same_weights(reference, fit_here(tmp_path / "run", make_loader, resume=True))


def test_streaming_hugging_face_dataset_resumes_from_its_own_state(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is not installed (extra 'data')")
    def rows():
        data = blobs(24)
        for i in range(24):
            yield {"x": data[i][0].tolist(), "y": data[i][1].tolist()}

    def make_loader() -> Any:
        return DataLoader(datasets.IterableDataset.from_generator(rows).with_format("torch"), batch_size=4)

    reference = fit_here(tmp_path / "ref", make_loader, DictRegressor)
    fit_here(tmp_path / "run", make_loader, DictRegressor, crash_after=8)
    resumed = fit_here(tmp_path / "run", make_loader, DictRegressor, resume=True)  # no batch replayed (no warning)
    assert same_weights(reference, resumed)


class Unpositionable(IterableDataset):
    def __iter__(self):
        data = blobs(24)
        return (data[i] for i in range(24))


def test_an_iterable_dataset_without_state_warns_by_name_when_resumed(tmp_path: Path) -> None:
    make_loader = lambda: DataLoader(Unpositionable(), batch_size=4)  # noqa: E731
    fit_here(tmp_path, make_loader, crash_after=3)
    with pytest.warns(UserWarning, match="Unpositionable .*no state_dict.* the 3 finished batches are read again"):
        trainer = make_trainer(tmp_path, max_epochs=2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck")])
        trainer.fit(TinyRegressor(), make_loader(), ckpt_path="last")


# ---------------------------------------------------------------------------------------------------- the Engine
class Jittered(Dataset):
    """24 samples jittered by torch, random and numpy draws where they are loaded; records the indices read."""

    def __init__(self) -> None:
        self.data = blobs(24)
        self.read: list[int] = []

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> Any:
        self.read.append(index)
        x, y = self.data[index]
        return x + torch.rand(6) * 0.1 + random.random() * 0.1 + float(np.random.rand()) * 0.1, y


def engine_loop(state_dir: Path, save_at: int = 0, resume: bool = False, workers: int = 2) -> list[str]:
    """Two epochs of a hand-written Engine loop; each step's loss as ``float.hex``. ``save_at``: save_state after that
    many steps and stop; ``resume``: load_state first (another initial RNG, as a new process would have)."""
    torch.manual_seed(99 if resume else 0)
    engine = Engine(accelerator="cpu", devices=1)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Jittered(), batch_size=4, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    model, optimizer, loader = engine.prepare(model, optimizer, loader)
    if resume:
        engine.load_state(state_dir)
    losses, steps_done = [], 0
    while loader.epoch < 2:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            engine.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item().hex())
            steps_done += 1
            if steps_done == save_at:
                engine.save_state(state_dir)
                return losses
    return losses


def test_engine_save_state_with_augmenting_workers_resumes_bitwise_equal_with_another_worker_count(
    tmp_path: Path,
) -> None:
    reference = engine_loop(tmp_path)
    first = engine_loop(tmp_path, save_at=8)  # the third batch of the second epoch is next
    assert first + engine_loop(tmp_path, resume=True, workers=1) == reference


def test_engine_skip_first_batches_enters_the_epoch_without_reading_the_skipped_batches() -> None:
    def first_pass(skip: int) -> tuple[list[Any], list[int]]:
        torch.manual_seed(0)
        engine = Engine(accelerator="cpu", devices=1)
        dataset = Recorded()
        loader = engine.prepare(DataLoader(dataset, batch_size=4, shuffle=True))
        batches = [batch.tolist() for batch in engine.skip_first_batches(loader, skip)]
        return batches, dataset.read

    everything, _ = first_pass(0)
    batches, read = first_pass(4)
    assert batches == everything[4:]
    assert read == [i for batch in everything[4:] for i in batch]  # the skipped batches were never loaded


class Recorded(Dataset):
    def __init__(self) -> None:
        self.read: list[int] = []

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> int:
        self.read.append(index)
        return index


class Opened(Dataset):
    """Needs a handle its loader's worker_init_fn opens per worker (as with h5py files)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return self.handle + index


def open_handle(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.handle = 100


def test_a_worker_init_fn_that_sets_up_the_dataset_still_reaches_the_users_dataset() -> None:
    from trainer.checkpoint.data_position import TrainDataPosition

    loader = DataLoader(Opened(), batch_size=4, num_workers=2, worker_init_fn=open_handle)
    batches = [batch.tolist() for batch in TrainDataPosition().iterator(loader, 0)]
    assert batches == [[100, 101, 102, 103], [104, 105, 106, 107]]
    assert type(loader.dataset) is Opened  # the user's loader is left as it was


# ------------------------------------------------------------------- datasets that keep their own state, per rank
DATASET_SCRIPT = Path(__file__).parent / "scripts" / "stateful_dataset_fit.py"


def fit_dataset(root: Path, kind: str, *args: str, expect: int = 0) -> None:
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(DATASET_SCRIPT), str(root), str(root / "steps"), kind, *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == expect, proc.stderr[-3000:]
    assert "read again and dropped" not in proc.stderr  # positioned from each rank's own state, never replayed


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["--streaming", "--custom"])
def test_two_ranks_over_a_stateful_dataset_resume_each_from_its_own_position(tmp_path: Path, kind: str) -> None:
    if kind == "--streaming":
        pytest.importorskip("datasets", reason="Hugging Face datasets is not installed (extra 'data')")
    fit_dataset(tmp_path / "reference", kind)
    fit_dataset(tmp_path / "run", kind, "--kill-batch", "9", expect=KILLED)  # the fourth of 6 batches, epoch 2
    fit_dataset(tmp_path / "run", kind, "--resume")
    for rank in range(2):  # the killed run's steps, then the resumed run's: bitwise the uninterrupted run's
        assert steps(tmp_path / "run", rank) == steps(tmp_path / "reference", rank)
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert len(checkpoint["train_sampler"]["dataset_states"]) == 2  # one entry per rank


class Counting(IterableDataset):
    """Yields 0..11; its state is the next number."""

    def __init__(self) -> None:
        self.next = 0

    def __iter__(self):
        while self.next < 12:
            self.next += 1
            yield self.next - 1
        self.next = 0

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


def test_a_dataset_state_saved_at_two_ranks_resumed_at_one_warns_by_name_and_replays() -> None:
    from trainer.checkpoint.data_position import TrainDataPosition

    saving = TrainDataPosition()
    saving.rank, saving.world_size = 0, 2
    batches = saving.iterator(DataLoader(Counting(), batch_size=2), epoch=0)
    next(batches), next(batches), next(batches)  # the loop reads one batch ahead of the 2 it finished
    saved = saving.state_dict(gather=lambda own: [own, own], consumed=2)
    assert [count for count, _ in saved["dataset_states"][1]["states"]] == [2, 3]

    resuming = TrainDataPosition()
    with pytest.warns(UserWarning, match=r"Counting \(in a DataLoader\) kept its state for 2 rank\(s\).*1"):
        rest = list(resuming.iterator(DataLoader(Counting(), batch_size=2), epoch=0, skip=2, saved=saved))
    assert [b.tolist() for b in rest] == [[4, 5], [6, 7], [8, 9], [10, 11]]  # replayed: nothing silently skipped
    after = resuming.state_dict(consumed=6)["dataset_states"][0]["states"]
    assert [count for count, _ in after] == [5, 6]  # tracked through the replay: the next resume is positioned


def test_the_same_trainer_continuing_its_epoch_at_two_ranks_reads_its_own_dataset_state() -> None:
    from trainer.checkpoint.data_position import TrainDataPosition

    position = TrainDataPosition()
    position.rank, position.world_size = 1, 2
    batches = position.iterator(DataLoader(Counting(), batch_size=2), epoch=0)
    next(batches), next(batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # positioned from its state, not replayed
        rest = list(position.iterator(DataLoader(Counting(), batch_size=2), 0, 2, position.state_dict()))
    assert [b.tolist() for b in rest] == [[4, 5], [6, 7], [8, 9], [10, 11]]
