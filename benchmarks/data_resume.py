"""Resuming data mid-epoch: the time to the first batch against the position, and the per-sample cost of exact
per-sample randomness (:mod:`trainer.data.sample_seeds`).

    python benchmarks/data_resume.py                  # both parts
    python benchmarks/data_resume.py --part position  # time to first batch at positions 10, 1e4, 1e6
    python benchmarks/data_resume.py --part seeds     # per-sample seeds on vs off, 2 workers

Position: a shuffled map-style dataset of 2,000,000 samples, batch 1, resumed at batch 10, 10⁴ and 10⁶ of its epoch.
"entered" is this framework (the saved order, re-drawn once and entered at its position); "replayed" draws and
drops the skipped index batches (this framework before, and any sampler whose order is not known); "read" loads and
collates the skipped batches (Accelerate's ``skip_first_batches``), timed at 10 and 10⁴ only. Target: "entered" flat.

Seeds: an epoch of a 2-worker DataLoader over a dataset that augments a 3x32x32 image (torch, random and numpy
draws), with per-sample seeds on and off, interleaved repeats, medians. Target: ≤ 1.02×; the seeding itself is
also timed alone per sample.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainer.checkpoint.data_position import TrainDataPosition
from trainer.data.sample_seeds import sample_seed, seed_sample


class Indices(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class Augmented(Dataset):
    def __init__(self, n: int) -> None:
        self.images = torch.rand(n, 3, 32, 32)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Any:
        image = self.images[index]
        if random.random() < 0.5:
            image = image.flip(-1)
        top, left = np.random.randint(0, 5, size=2)
        image = torch.nn.functional.pad(image, (2, 2, 2, 2))[:, top : top + 32, left : left + 32]
        return image + 0.01 * torch.randn_like(image)


def time_to_first_batch(loader: DataLoader, saved: dict[str, Any], position: int, mode: str) -> float:
    """CPU seconds of this process from resuming at ``position`` to holding the first batch (one process, so other
    processes on a shared machine disturb it less than wall time)."""
    position_state = dict(saved)
    if mode == "replayed":
        position_state["order"] = None
    start = time.process_time()
    if mode == "read":
        iterator = iter(loader)
        for _ in range(position):
            next(iterator)
    else:
        iterator = TrainDataPosition().iterator(loader, 0, position, position_state)
    next(iterator)
    return time.process_time() - start


def position_part(repeats: int) -> None:
    torch.manual_seed(0)
    loader = DataLoader(Indices(2_000_000), batch_size=1, shuffle=True)
    first = TrainDataPosition()
    next(first.iterator(loader, 0))
    saved = first.state_dict()
    positions, modes = (10, 10_000, 1_000_000), ("entered", "replayed", "read")
    times: dict[tuple[int, str], list[float]] = {(p, m): [] for p in positions for m in modes}
    for _ in range(repeats):  # round robin, so a busy moment of the machine falls on every cell alike
        for position in positions:
            for mode in modes:
                if not (mode == "read" and position > 10_000):
                    times[position, mode].append(time_to_first_batch(loader, saved, position, mode))
    print(f"time to the first batch after resuming (CPU ms, median of {repeats}), dataset of 2,000,000, batch 1:")
    print(f"{'position':>10} {'entered':>10} {'replayed':>10} {'read':>10}")
    for position in positions:
        row = [f"{statistics.median(times[position, m]) * 1e3:.1f}" if times[position, m] else "—" for m in modes]
        print(f"{position:>10} {row[0]:>10} {row[1]:>10} {row[2]:>10}")


def epoch_time(loader: DataLoader, seeds: bool) -> float:
    position = TrainDataPosition(sample_seeds=seeds)
    position.run_seed = 0
    start = time.perf_counter()
    for _ in position.iterator(loader, 0):
        pass
    return time.perf_counter() - start


def seeds_part(repeats: int) -> None:
    torch.manual_seed(0)
    n = 4096
    loader = DataLoader(Augmented(n), batch_size=64, shuffle=True, num_workers=2, persistent_workers=True)
    epoch_time(loader, False)  # start the workers
    on, off = [], []
    for _ in range(repeats):
        off.append(epoch_time(loader, False))
        on.append(epoch_time(loader, True))
    ratios = [a / b for a, b in zip(on, off)]
    print(f"an epoch of {n} augmented samples, 2 workers, batch 64 (median of {repeats} interleaved):")
    print(f"  without per-sample seeds {statistics.median(off) / n * 1e6:.1f} µs/sample, "
          f"with {statistics.median(on) / n * 1e6:.1f} µs/sample: {statistics.median(ratios):.3f}×")  # fmt: skip
    count = 20_000
    start = time.perf_counter()
    for index in range(count):
        seed_sample(sample_seed(12345, index))
    print(f"  seeding alone (torch, random, numpy): {(time.perf_counter() - start) / count * 1e6:.1f} µs/sample "
          f"(spread over the workers)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("position", "seeds", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.part in ("position", "both"):
        position_part(args.repeats)
    if args.part in ("seeds", "both"):
        seeds_part(args.repeats)


if __name__ == "__main__":
    main()
