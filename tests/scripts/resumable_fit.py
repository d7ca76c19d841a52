"""A small fit that the exact-resume tests kill and resume: shuffled loaders, dropout, Adam, StepLR,
gradient accumulation and validation inside epochs.

    python resumable_fit.py ROOT OUT [--kill-batch N] [--kill-val N] [--save-every-batch] [--resume]
                            [--sleep S] [--ready-after N --ready-file PATH] [--devices N] [--combined MODE]

ROOT holds the checkpoints; OUT receives the final module weights. ``--kill-batch N`` ends the process with
``os._exit`` before the micro-batch after N finished ones; ``--kill-val N`` during the N-th validation batch
of the fit (sanity check excluded). ``--combined MODE`` trains on two shuffled loaders combined in that
CombinedLoader mode (10 and 6 batches per epoch; ``max_size_cycle`` as the plain dict Lightning users return).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from trainer.callbacks import Callback, ModelCheckpoint  # noqa: E402
from trainer import CombinedLoader, Trainer, TrainModule  # noqa: E402

KILLED = 3


class Net(TrainModule):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))
        self.kill_val = 0
        self.sleep = 0.0
        self.val_batches = 0

    def training_step(self, batch, batch_idx):
        if self.sleep:
            time.sleep(self.sleep)
        parts = [part for part in batch.values() if part is not None] if isinstance(batch, dict) else [batch]
        loss = sum(nn.functional.mse_loss(self.net(x), y) for x, y in parts)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        if not self.trainer.sanity_checking:
            self.val_batches += 1
            if self.val_batches == self.kill_val:
                os._exit(KILLED)
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)}


class Kill(Callback):
    def __init__(self, after_batches: int) -> None:
        self.after_batches = after_batches

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.fit_loop.progress.total_batches == self.after_batches:
            os._exit(KILLED)


class SaveEveryBatch(Callback):
    """Saves after every micro-batch, inside accumulation windows too."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        trainer.save_checkpoint(self.path)


class Ready(Callback):
    def __init__(self, after_batches: int, path: str) -> None:
        self.after_batches, self.path = after_batches, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.fit_loop.progress.total_batches == self.after_batches:
            open(self.path, "w").close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--kill-batch", type=int, default=0)
    parser.add_argument("--kill-val", type=int, default=0)
    parser.add_argument("--save-every-batch", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ready-after", type=int, default=0)
    parser.add_argument("--ready-file", default="")
    parser.add_argument("--devices", type=int, default=1, help="> 1: DDP over that many CPU processes")
    parser.add_argument("--combined", default="", help="train on two loaders combined in this mode")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    data = TensorDataset(torch.randn(40, 6), torch.randn(40, 1))
    train = DataLoader(data, batch_size=4, shuffle=True)  # 10 micro-batches per epoch
    val = DataLoader(TensorDataset(torch.randn(12, 6), torch.randn(12, 1)), batch_size=4, shuffle=True)
    if args.combined:
        second = DataLoader(TensorDataset(torch.randn(24, 6), torch.randn(24, 1)), batch_size=4, shuffle=True)
        loaders = {"a": train, "b": second}
        train = loaders if args.combined == "max_size_cycle" else CombinedLoader(loaders, args.combined)
    module = Net()
    module.kill_val, module.sleep = args.kill_val, args.sleep
    checkpoint_dir = os.path.join(args.root, "checkpoints")
    callbacks = [ModelCheckpoint(dirpath=checkpoint_dir, every_n_train_steps=1, save_last=True)]
    if args.kill_batch:
        callbacks.append(Kill(args.kill_batch))
    if args.save_every_batch:
        callbacks.append(SaveEveryBatch(os.path.join(checkpoint_dir, "every-batch.ckpt")))
    if args.ready_after:
        callbacks.append(Ready(args.ready_after, args.ready_file))
    distributed = {"devices": args.devices, "strategy": "ddp", "accelerator": "cpu"} if args.devices > 1 else {}
    trainer = Trainer(
        **distributed, max_epochs=3, accumulate_grad_batches=3, val_check_interval=4, default_root_dir=args.root, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, stop_signals=("SIGTERM",),
    )
    trainer.fit(module, train, val, ckpt_path="last" if args.resume else None)
    if trainer.is_global_zero:
        torch.save(module.state_dict(), args.out)


if __name__ == "__main__":
    main()
