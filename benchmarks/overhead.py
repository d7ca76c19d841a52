"""Per-step overhead of the Trainer against a hand-written PyTorch loop on the same workload.

Both run in one process, interleaved (raw, trainer, raw, trainer, ...), each repeat timed separately;
the medians are compared. One thread (``torch.set_num_threads(1)``) so the two do not fight for cores.

    python benchmarks/overhead.py                 # tiny (32-64-10, batch 32) and medium (512-1024-1024-10, batch 256)
    python benchmarks/overhead.py --defaults      # also the Trainer with its default callbacks and logger on

Targets: tiny ≤ 1.10×, medium ≤ 1.01×, tiny with defaults ≤ 1.25×.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule

WORKLOADS = {
    "tiny": {"sizes": (32, 64, 10), "batch": 32, "steps": 2000},
    "medium": {"sizes": (512, 1024, 1024, 10), "batch": 256, "steps": 200},
}


def make_mlp(sizes: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_loader(sizes: tuple[int, ...], batch: int, steps: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch * steps, sizes[0], generator=generator)
    y = torch.randint(0, sizes[-1], (batch * steps,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


class BenchModule(TrainModule):
    """The same MLP, loss and optimizer as the raw loop, logging the loss every step."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.net = make_mlp(sizes)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run_raw(sizes: tuple[int, ...], loader: DataLoader) -> float:
    torch.manual_seed(0)
    model = make_mlp(sizes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - start


def run_trainer(sizes: tuple[int, ...], loader: DataLoader, defaults: bool, root: str) -> float:
    torch.manual_seed(0)
    module = BenchModule(sizes)
    if defaults:
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=root)
    else:
        trainer = Trainer(
            accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
        )  # fmt: skip
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the default callbacks print a summary and a report
        trainer.fit(module, loader)
    return time.perf_counter() - start


def measure(name: str, repeats: int, trainer_fn: Callable[[], float], raw_fn: Callable[[], float], steps: int) -> float:
    """Alternate raw and Trainer runs; report median µs/step of each and the median of per-round ratios
    (each round's two runs are back to back, so a change in machine load affects both alike)."""
    raw_fn(), trainer_fn()  # warm-up: imports, allocator, first-call costs
    raw_times, trainer_times = [], []
    for _ in range(repeats):
        raw_times.append(raw_fn())
        trainer_times.append(trainer_fn())
    raw_us = statistics.median(raw_times) / steps * 1e6
    trainer_us = statistics.median(trainer_times) / steps * 1e6
    ratio = statistics.median(t / r for t, r in zip(trainer_times, raw_times))
    print(f"{name:<22} raw {raw_us:8.1f} µs/step   trainer {trainer_us:8.1f} µs/step   ratio {ratio:.3f}×")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--defaults", action="store_true", help="also measure with default callbacks and logger")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        for name in args.workloads:
            spec = WORKLOADS[name]
            sizes, steps = spec["sizes"], spec["steps"]
            loader = make_loader(sizes, spec["batch"], steps)
            measure(name, args.repeats, lambda: run_trainer(sizes, loader, False, root),
                    lambda: run_raw(sizes, loader), steps)  # fmt: skip
            if args.defaults and name == "tiny":
                measure(f"{name} (defaults on)", args.repeats, lambda: run_trainer(sizes, loader, True, root),
                        lambda: run_raw(sizes, loader), steps)  # fmt: skip


if __name__ == "__main__":
    main()
