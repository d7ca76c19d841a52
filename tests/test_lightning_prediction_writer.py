"""``BasePredictionWriter`` as a Lightning project subclasses it: predictions written per batch, at the end, or both,
with the batch's dataset indices; a bad ``write_interval`` is refused."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import ConfigurationError, Trainer, TrainModule
from trainer.callbacks import BasePredictionWriter


class Doubler(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return batch[0] * 2


def loader(n: int = 10, shuffle: bool = False) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n, dtype=torch.float32)), batch_size=4, shuffle=shuffle)


class FileWriter(BasePredictionWriter):
    """Writes each prediction to a file, as the Lightning docs' example does."""

    def __init__(self, folder, write_interval):
        super().__init__(write_interval)
        self.folder = folder
        self.batch_calls = []
        self.epoch_calls = []

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        torch.save(prediction, self.folder / f"{dataloader_idx}_{batch_idx}.pt")
        self.batch_calls.append((batch_indices, batch_idx, dataloader_idx))

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        torch.save(predictions, self.folder / "all.pt")
        self.epoch_calls.append(batch_indices)


def run(tmp_path, interval, loaders, return_predictions=False):
    writer = FileWriter(tmp_path, interval)
    trainer = Trainer(accelerator="cpu", callbacks=[writer], logger=False, enable_progress_bar=False)
    out = trainer.predict(Doubler(), loaders, return_predictions=return_predictions)
    return writer, out


def test_batch_interval_writes_each_batch_with_its_indices(tmp_path):
    writer, out = run(tmp_path, "batch", loader())
    assert out is None and writer.epoch_calls == []
    assert writer.batch_calls == [([0, 1, 2, 3], 0, 0), ([4, 5, 6, 7], 1, 0), ([8, 9], 2, 0)]
    assert torch.equal(torch.load(tmp_path / "0_2.pt"), torch.tensor([16.0, 18.0]))
    assert not (tmp_path / "all.pt").exists()


def test_epoch_interval_writes_everything_once_even_without_returned_predictions(tmp_path):
    writer, out = run(tmp_path, "epoch", loader())
    assert out is None and writer.batch_calls == []
    assert writer.epoch_calls == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]]
    written = torch.load(tmp_path / "all.pt")
    assert torch.equal(torch.cat(written), torch.arange(10, dtype=torch.float32) * 2)


def test_batch_and_epoch_with_two_loaders(tmp_path):
    writer, out = run(tmp_path, "batch_and_epoch", [loader(4), loader(6)], return_predictions=True)
    assert [call[1:] for call in writer.batch_calls] == [(0, 0), (0, 1), (1, 1)]
    assert writer.epoch_calls == [[[[0, 1, 2, 3]], [[0, 1, 2, 3], [4, 5]]]]
    written = torch.load(tmp_path / "all.pt")
    assert len(written) == 2 and torch.equal(written[1][1], out[1][1])


def test_shuffled_loader_gives_no_indices(tmp_path):
    with pytest.warns(UserWarning, match="shuffles"):
        writer, _ = run(tmp_path, "batch", loader(shuffle=True))
    assert [call[0] for call in writer.batch_calls] == [None, None, None]


def test_bad_interval_and_missing_override_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="`write_interval` should be one of"):
        BasePredictionWriter("step")
    trainer = Trainer(accelerator="cpu", callbacks=[BasePredictionWriter("epoch")], logger=False,
                      enable_progress_bar=False)  # fmt: skip
    with pytest.raises(NotImplementedError, match="write_on_epoch_end"):
        trainer.predict(Doubler(), loader())
