"""Per-step overhead of the Trainer against a hand-written PyTorch loop on the same workload.

Both run in one process, interleaved (raw, trainer, raw, trainer, ...), each repeat timed separately;
the medians are compared. One thread (``torch.set_num_threads(1)``) so the two do not fight for cores.

    python benchmarks/overhead.py                 # tiny (32-64-10, batch 32) and medium (512-1024-1024-10, batch 256)
    python benchmarks/overhead.py --defaults      # also the Trainer with its default callbacks and logger on
    python benchmarks/overhead.py --engine        # also the same loop written with the Engine
    python benchmarks/overhead.py --monitor       # also ThroughputMonitor counting FLOPs against one that does not
    python benchmarks/overhead.py --clock process # CPU time of this process instead of wall time (a shared machine)

Targets: tiny ≤ 1.05×, medium ≤ 1.01×, tiny with defaults ≤ 1.25×, the Engine ≤ the Trainer, FLOP counting 1.00×.
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

clock: Callable[[], float] = time.perf_counter  # --clock process: time.process_time

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
    start = clock()
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return clock() - start


def run_trainer(sizes: tuple[int, ...], loader: DataLoader, defaults: bool, root: str, callbacks: tuple = ()) -> float:
    torch.manual_seed(0)
    module = BenchModule(sizes)
    if defaults:
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=root)
    else:
        trainer = Trainer(
            accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, callbacks=list(callbacks),
        )  # fmt: skip
    start = clock()
    with contextlib.redirect_stdout(io.StringIO()):  # the default callbacks print a summary and a report
        trainer.fit(module, loader)
    return clock() - start


def run_engine(sizes: tuple[int, ...], loader: DataLoader) -> float:
    """The raw loop written with the Engine: prepared objects, accumulate(), engine.backward()."""
    from trainer import Engine

    torch.manual_seed(0)
    engine = Engine(accelerator="cpu", devices=1)
    model = make_mlp(sizes)
    model, optimizer, prepared = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01), loader)
    start = clock()
    for x, y in prepared:
        with engine.accumulate(model):
            engine.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    return clock() - start


def measure(name: str, repeats: int, trainer_fn: Callable[[], float], raw_fn: Callable[[], float], steps: int,
            label: str = "trainer", raw_label: str = "raw") -> float:  # fmt: skip
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
    print(f"{name:<22} {raw_label} {raw_us:8.1f} µs/step   {label} {trainer_us:8.1f} µs/step   ratio {ratio:.3f}×")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--defaults", action="store_true", help="also measure with default callbacks and logger")
    parser.add_argument("--engine", action="store_true", help="also measure the loop written with the Engine")
    parser.add_argument("--monitor", action="store_true",
                        help="also measure ThroughputMonitor counting FLOPs against one with count_flops=False")
    parser.add_argument("--clock", choices=["wall", "process"], default="wall",
                        help="process: this process's CPU time, which other processes on a shared machine disturb less")
    args = parser.parse_args()
    global clock
    clock = time.process_time if args.clock == "process" else time.perf_counter
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
            if args.monitor and name == "tiny":
                from trainer.callbacks import ThroughputMonitor

                def monitored(count_flops: bool) -> float:  # data_wait_threshold=1: no bottleneck advice printed
                    monitor = ThroughputMonitor(count_flops=count_flops, peak_flops=1e12, data_wait_threshold=1.0)
                    return run_trainer(sizes, loader, False, root, (monitor,))

                counting, plain = (lambda: monitored(True)), (lambda: monitored(False))
                measure(f"{name} (FLOP counting)", args.repeats, counting, plain, steps, label="counting",
                        raw_label="not counting")  # fmt: skip
            if args.engine:
                measure(f"{name} (engine)", args.repeats, lambda: run_engine(sizes, loader),
                        lambda: run_raw(sizes, loader), steps, label="engine ")  # fmt: skip


if __name__ == "__main__":
    main()
