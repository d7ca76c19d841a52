"""Step time with checkpoints every 10 steps, synchronous and asynchronous, against no checkpoints.

A ~100 MB model (six 2048x2048 linear layers, plain SGD: the checkpoint is the weights) trains on one thread;
``ModelCheckpoint(every_n_train_steps=10)`` keeps the newest file in a temporary folder. The three settings run
interleaved (none, sync, async, none, ...), each repeat a fresh fit timed whole; the ratios are medians of
per-round ratios.

    python benchmarks/checkpoint.py [--steps 60] [--repeats 5]

Target: async ≤ 1.05x no checkpoints (the copy on the training thread is all it costs; torch.save, the CRC-32s
and the fsync run in the writer thread). Sync is printed for comparison.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.callbacks import ModelCheckpoint
from trainer import Trainer, TrainModule

WIDTH, LAYERS, BATCH, EVERY = 2048, 6, 32, 10


class Wide(TrainModule):
    """Six 2048x2048 layers: 25.2 M parameters, 100.7 MB in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        # Keep the 100 MB of gradient buffers: freeing and reallocating them every step made the step time depend
        # on the allocator's state, which a checkpoint's own allocations change (sync saves read 20% faster than
        # no saves at all).
        optimizer.zero_grad(set_to_none=False)


def seconds_per_step(mode: str, steps: int, folder: str) -> float:
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(BATCH * steps, WIDTH)), batch_size=BATCH)
    callbacks = [] if mode == "none" else [ModelCheckpoint(dirpath=folder, every_n_train_steps=EVERY,
                                                           asynchronous=mode == "async")]  # fmt: skip
    trainer = Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=mode != "none", callbacks=callbacks,
                      num_sanity_val_steps=0)  # fmt: skip
    module = Wide()
    start = time.perf_counter()
    trainer.fit(module, data)  # returns once the last background write is complete
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    size = sum(p.numel() * p.element_size() for p in Wide().parameters()) / 1e6
    times: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
    with tempfile.TemporaryDirectory() as folder:
        seconds_per_step("async", EVERY + 1, folder)  # warm-up: allocator, page cache, writer thread
        for _ in range(args.repeats):
            for mode in times:
                times[mode].append(seconds_per_step(mode, args.steps, folder))
    print(f"model {size:.1f} MB, checkpoint every {EVERY} steps, {args.steps} steps x {args.repeats} repeats")
    ratios = {}
    for mode in ("none", "sync", "async"):  # median of per-round ratios: a round's runs are back to back
        ratios[mode] = statistics.median(t / n for t, n in zip(times[mode], times["none"]))
        print(f"{mode:>5}: {statistics.median(times[mode]) * 1e3:8.1f} ms/step  ratio {ratios[mode]:.3f}x")
    ratio = ratios["async"]
    print(f"async / none = {ratio:.3f}x (target <= 1.05x): {'ok' if ratio <= 1.05 else 'MISSED'}")


if __name__ == "__main__":
    main()
