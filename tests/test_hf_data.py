"""Tokenised data from Hugging Face ``datasets`` as training data: a map-style ``Dataset`` and a streaming
``IterableDataset`` (from a local generator: no download), the streaming one resumed mid-epoch exactly through its
own ``state_dict()``."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainer import TrainModule
from trainer.callbacks import ModelCheckpoint

from helpers import Crash
from ckpt_support import make_trainer

datasets = pytest.importorskip("datasets", reason="datasets is not installed (the data extra, installed by make test)")

VOCAB, SEQ, ROWS = 16, 6, 40


def documents():
    """A local corpus of token rows (what a tokenizer's map would produce)."""
    generator = torch.Generator().manual_seed(3)
    for _ in range(ROWS):
        tokens = torch.randint(0, VOCAB, (SEQ + 1,), generator=generator).tolist()
        yield {"input_ids": tokens[:-1], "labels": tokens[1:]}


class TinyLM(TrainModule):
    """An embedding and a head; records the token rows of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, VOCAB)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen += batch["input_ids"].tolist()
        logits = self.head(self.embed(batch["input_ids"]))
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def streamed() -> Any:
    # (no shuffle buffer: datasets does not save its contents, so a resume with one is not exact, by its design)
    return datasets.IterableDataset.from_generator(documents).with_format("torch")


def run(root: Path, crash_after: int = 0, resume: bool = False) -> TinyLM:
    torch.manual_seed(0)
    module = TinyLM()
    callbacks: list[Any] = [ModelCheckpoint(dirpath=root / "ck", every_n_train_steps=1, save_last=True)]
    if crash_after:
        callbacks.append(Crash(crash_after))
    trainer = make_trainer(root, callbacks=callbacks, max_epochs=2)
    loader = DataLoader(streamed(), batch_size=4)
    if crash_after:
        with pytest.raises(RuntimeError, match="simulated crash"):
            trainer.fit(module, loader)
    else:
        trainer.fit(module, loader, ckpt_path="last" if resume else None)
    return module


def test_a_map_style_dataset_trains_and_is_split_across_ranks_by_the_sampler(tmp_path: Path) -> None:
    data = datasets.Dataset.from_generator(documents).with_format("torch")
    module = TinyLM()
    make_trainer(tmp_path, max_epochs=1).fit(module, DataLoader(data, batch_size=8, shuffle=True))
    assert len(module.seen) == ROWS and sorted(map(tuple, module.seen)) == sorted(
        tuple(row["input_ids"]) for row in documents())


def test_a_streaming_dataset_resumes_mid_epoch_exactly_through_its_own_state(tmp_path: Path) -> None:
    reference = run(tmp_path / "ref")
    per_epoch = ROWS // 4
    crash_after = per_epoch + 3  # the fourth batch of the second epoch
    run(tmp_path / "run", crash_after=crash_after)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # not the "read again and dropped" replay
        warnings.filterwarnings("ignore", message="(?!.*read again).*")
        resumed = run(tmp_path / "run", resume=True)
    assert resumed.seen == reference.seen[crash_after * 4:]  # nothing replayed into the step, nothing skipped
    checkpoint = torch.load(tmp_path / "run" / "ck" / "last.ckpt", weights_only=False)
    rank_zero = checkpoint["train_sampler"]["dataset_states"][0]  # the dataset's own state_dict()s, one entry per rank
    (_, state), (count, last) = rank_zero["states"]
    assert count == per_epoch and last["examples_iterable"]["shard_example_idx"] == ROWS and last["epoch"] == 1


def test_the_streaming_split_datasets_gives_each_rank_its_own_rows() -> None:
    from datasets.distributed import split_dataset_by_node

    parts = [list(split_dataset_by_node(streamed(), rank=r, world_size=2)) for r in range(2)]
    rows = [tuple(row["input_ids"].tolist()) for part in parts for row in part]
    assert len(parts[0]) == len(parts[1]) == ROWS // 2 and len(set(rows)) == ROWS
