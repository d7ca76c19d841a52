"""A fit on data with random augmentation drawn in ``__getitem__`` (torch, random and numpy global generators),
shuffled, read by worker processes; the exact-data tests kill it mid-epoch and resume it.

    python augmented_fit.py ROOT OUT [--devices N] [--workers N] [--batch-size B] [--kill-batch N] [--resume]
                            [--epochs E] [--no-sample-seeds]

Every rank appends one line per training step to ``OUT.rank<R>``: ``epoch batch_idx loss.hex() indices``
(the sample indices of the batch), so runs can be compared bitwise, step by step. ``--kill-batch N`` ends the
process with ``os._exit`` before the micro-batch after N finished ones (a checkpoint is saved every step).
"""
from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from trainer import Trainer, TrainModule  # noqa: E402
from trainer.callbacks import Callback, ModelCheckpoint  # noqa: E402

KILLED = 3


class Augmented(Dataset):
    """32 samples; each is jittered by torch, random and numpy draws made where it is loaded."""

    def __init__(self, n: int = 32) -> None:
        generator = torch.Generator().manual_seed(5)
        self.x, self.y = torch.randn(n, 6, generator=generator), torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        noise = torch.rand(6) * 0.1 + random.random() * 0.1 + float(np.random.rand()) * 0.1
        return self.x[index] + noise, self.y[index], index


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))
        self.record = ""

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        with open(f"{self.record}.rank{self.global_rank}", "a") as out:
            out.write(f"{self.current_epoch} {batch_idx} {loss.item().hex()} {','.join(map(str, index.tolist()))}\n")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Kill(Callback):
    def __init__(self, after_batches: int) -> None:
        self.after_batches = after_batches

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.fit_loop.progress.total_batches == self.after_batches:
            os._exit(KILLED)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--kill-batch", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--no-sample-seeds", action="store_true")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    loader = DataLoader(Augmented(), batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0)  # fmt: skip
    module = Net()
    module.record = args.out
    callbacks = [ModelCheckpoint(dirpath=os.path.join(args.root, "checkpoints"), every_n_train_steps=1, save_last=True)]
    if args.kill_batch:
        callbacks.append(Kill(args.kill_batch))
    distributed = {"devices": args.devices, "strategy": "ddp", "accelerator": "cpu"} if args.devices > 1 else {}
    trainer = Trainer(**distributed, max_epochs=args.epochs, default_root_dir=args.root, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=callbacks, sample_seeds=not args.no_sample_seeds)  # fmt: skip
    trainer.fit(module, loader, ckpt_path="last" if args.resume else None)


if __name__ == "__main__":
    main()
