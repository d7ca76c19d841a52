"""A 2-rank DDP fit over an ``IterableDataset`` that keeps its own position, read in the main process (a plain
``DataLoader``, ``num_workers=0``); the exact-data tests kill it mid-epoch and resume it.

    python stateful_dataset_fit.py ROOT OUT (--streaming | --custom) [--devices N] [--kill-batch N] [--resume]

``--streaming``: a Hugging Face streaming ``datasets.IterableDataset`` from a local generator, split per rank by
``split_dataset_by_node``. ``--custom``: a plain ``IterableDataset`` with ``state_dict()``/``load_state_dict()``
reading every ``world_size``-th row from ``rank``. Every rank appends one line per step to ``OUT.rank<R>``:
``epoch batch_idx loss.hex() rows``. ``--kill-batch N`` ends the process with ``os._exit`` before the batch after
N finished ones (a checkpoint is saved every step).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from trainer import Trainer, TrainModule  # noqa: E402
from trainer.callbacks import Callback, ModelCheckpoint  # noqa: E402

KILLED = 3
ROWS = 48


def table() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return torch.randn(ROWS, 6, generator=generator), torch.randn(ROWS, 1, generator=generator)


def rows() -> Iterator[dict[str, Any]]:
    x, y = table()
    for i in range(ROWS):
        yield {"x": x[i].tolist(), "y": y[i].tolist(), "row": i}


class Strided(IterableDataset):
    """Rows ``rank, rank + world_size, ...``; its state is the next row to read (and the epoch it belongs to)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.x, self.y = table()
        self.next_row = rank

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self.next_row < ROWS:
            row = self.next_row
            self.next_row += self.world_size
            yield {"x": self.x[row], "y": self.y[row], "row": row}
        self.next_row = self.rank  # the next epoch starts over

    def state_dict(self) -> dict[str, int]:
        return {"next_row": self.next_row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_row = state["next_row"]


class Net(TrainModule):
    """Reads its rank's part of the data (split once the Trainer has started the ranks)."""

    def __init__(self, streaming: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
        self.streaming = streaming
        self.record = ""

    def train_dataloader(self) -> DataLoader:
        rank, world_size = self.global_rank, self.trainer.world_size
        if self.streaming:
            import datasets
            from datasets.distributed import split_dataset_by_node

            stream = datasets.IterableDataset.from_generator(rows).with_format("torch")
            return DataLoader(split_dataset_by_node(stream, rank=rank, world_size=world_size), batch_size=4)
        return DataLoader(Strided(rank, world_size), batch_size=4)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"].float()), batch["y"].float())
        with open(f"{self.record}.rank{self.global_rank}", "a") as out:
            rows = ",".join(map(str, batch["row"].tolist()))
            out.write(f"{self.current_epoch} {batch_idx} {loss.item().hex()} {rows}\n")
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
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--streaming", action="store_true")
    kind.add_argument("--custom", action="store_true")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--kill-batch", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    module = Net(args.streaming)
    module.record = args.out
    callbacks = [ModelCheckpoint(dirpath=os.path.join(args.root, "checkpoints"), every_n_train_steps=1, save_last=True)]
    if args.kill_batch:
        callbacks.append(Kill(args.kill_batch))
    distributed = {"devices": args.devices, "strategy": "ddp", "accelerator": "cpu"} if args.devices > 1 else {}
    trainer = Trainer(**distributed, max_epochs=2, default_root_dir=args.root, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, callbacks=callbacks)  # fmt: skip
    trainer.fit(module, ckpt_path="last" if args.resume else None)


if __name__ == "__main__":
    main()
