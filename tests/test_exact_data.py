"""Data that resumes exactly: random augmentation drawn in ``__getitem__`` by worker processes, another worker
count, another world size (see tests/scripts/augmented_fit.py: torch, random and numpy draws per sample,
shuffled, ``num_workers=2``, persistent workers; every step's loss written as ``float.hex``).

The runs are real subprocesses (DDP over gloo for several ranks); a killed run dies by ``os._exit`` at a step
mid-epoch, right after the checkpoint of the step before.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

from trainer.data.epoch_order import order_record, rest_of_epoch

SCRIPT = Path(__file__).parent / "scripts" / "augmented_fit.py"
KILLED = 3


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
    skip = 2
    per_batch = batch_size or 1
    replicas = getattr(sampler, "num_replicas", 1)
    if generator is not None:
        generator.manual_seed(99)  # wherever the generator stands, the saved order is what is drawn
    torch.manual_seed(12)
    assert list(rest_of_epoch(record, skip * per_batch * replicas, index_sampler)) == expected[skip:]
    if generator is not None:
        assert torch.equal(generator.get_state(), after)  # the next epoch draws from where the uninterrupted one did


# ------------------------------------------------------------------------------- killed and resumed, bitwise
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
    fit(tmp_path / "reference", "--no-sample-seeds")
    fit(tmp_path / "run", "--kill-batch", "11", "--no-sample-seeds", expect=KILLED)
    fit(tmp_path / "run", "--resume", "--no-sample-seeds")
    assert steps(tmp_path / "run")[11:] != steps(tmp_path / "reference")[11:]


@pytest.fixture(scope="module")
def killed_at_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two DDP ranks, batch 4 each, killed at the second step of the second epoch (4 steps per epoch)."""
    root = tmp_path_factory.mktemp("two-ranks")
    fit(root, "--devices", "2", "--kill-batch", "6", expect=KILLED)
    return root


@pytest.mark.timeout(300)
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
