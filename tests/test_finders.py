"""Batch-size and learning-rate finders on a tiny model (issue 8)."""
from __future__ import annotations

import csv
import os
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler
from ui_fixtures import blobs, quiet_trainer

from trainer.callbacks import BatchSizeFinder, Callback, LearningRateFinder
from trainer.callbacks.lr_scaling import batch_scaling_factor
from trainer.callbacks.trial_steps import TrialSteps
from trainer.strategies.errors import ConfigurationError
from trainer import TrainModule


class Classifier(TrainModule):
    """Its train_dataloader() reads self.batch_size, as the finder expects."""

    def __init__(self, lr: float = 0.01, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(blobs(300), batch_size=self.batch_size, shuffle=True)


class Probe(Callback):
    """Records what training starts with, after the finders ran in on_fit_start."""

    def on_train_start(self, trainer, module):
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}
        self.batch_size = trainer.train_dataloader.batch_size
        self.num_batches = trainer.num_training_batches
        self.lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.optimizer_state = dict(trainer.optimizers[0].state)


def test_batch_size_finder_returns_the_largest_size_under_the_budget(tmp_path):
    module = Classifier()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    finder, probe = BatchSizeFinder(max_memory_mb=0.02, scale_lr=True), Probe()
    trainer = quiet_trainer(tmp_path, callbacks=[finder, probe], max_steps=0)
    trainer.fit(module)
    size = finder.optimal_batch_size
    assert 4 < size < 300
    assert finder.trials[size] <= 0.02 and finder.trials[size + 1] > 0.02  # the largest that fits, exactly
    assert list(finder.trials)[:6] == [2, 4, 8, 16, 32, 64]  # doubling first, then the binary search
    assert (module.batch_size, module.hparams.batch_size) == (size, size)
    assert (probe.batch_size, probe.num_batches) == (size, -(-300 // size))
    assert probe.lr == pytest.approx(0.01 * size / 4)  # linear scaling from the original batch size 4
    assert all(torch.equal(before[k], probe.weights[k]) for k in before)  # trial steps were undone
    assert probe.optimizer_state == {}


def test_trial_memory_grows_with_the_batch(tmp_path):
    class Measure(Callback):
        def on_fit_start(self, trainer, module):
            finder, trials = BatchSizeFinder(max_memory_mb=1), TrialSteps(trainer, module)
            self.mb = [finder.measure(trials, module, trainer.train_dataloader, n) for n in (8, 16, 32)]
            trials.restore()

    measure = Measure()
    quiet_trainer(tmp_path, callbacks=[measure], max_steps=0).fit(Classifier())
    mb8, mb16, mb32 = measure.mb
    per_sample = (8 + 64 + 64) * 4 / 2**20  # input, hidden pre-activation and ReLU output, float32
    assert mb8 == pytest.approx(8 * per_sample, rel=0.5)
    assert mb16 == pytest.approx(2 * mb8, rel=0.05) and mb32 == pytest.approx(4 * mb8, rel=0.05)


def test_batch_size_finder_rebuilds_a_loader_passed_to_fit_and_keeps_shuffling(tmp_path):
    finder, probe = BatchSizeFinder(max_memory_mb=0.01, max_val=40), Probe()
    trainer = quiet_trainer(tmp_path, callbacks=[finder, probe], max_steps=0)
    trainer.fit(Classifier(), DataLoader(blobs(300), batch_size=4, shuffle=True))
    assert probe.batch_size == finder.optimal_batch_size <= 40
    assert isinstance(trainer.train_dataloader.sampler, RandomSampler)
    assert probe.lr == 0.01  # scale_lr is off by default


def test_batch_size_finder_never_exceeds_the_dataset(tmp_path):
    for finder in (BatchSizeFinder(max_memory_mb=100), BatchSizeFinder(max_memory_mb=100, max_val=4096)):
        quiet_trainer(tmp_path, callbacks=[finder], max_steps=0).fit(Classifier())
        assert finder.optimal_batch_size == 300  # Classifier's 300 samples; a larger batch is one short epoch


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.randn(64, 8))


def test_batch_size_finder_without_a_budget_on_cpu_stops_at_its_bounds_and_says_when_nothing_fits(tmp_path):
    # As in Lightning, off CUDA no trial fails without max_memory_mb: the search ends at the dataset's length
    # (or max_val); with neither bound (max_val=None and a dataset without a length) it is refused.
    finder = BatchSizeFinder(mode="power")
    quiet_trainer(tmp_path, callbacks=[finder], max_steps=1).fit(Classifier())
    assert finder.optimal_batch_size == 300
    with pytest.raises(ConfigurationError, match="nothing bounds the search"):
        finder = BatchSizeFinder(max_val=None)
        finder.find(quiet_trainer(tmp_path), Classifier(), DataLoader(_Stream(), batch_size=2))
    with pytest.raises(RuntimeError, match="even batch size 2 does not fit"):
        quiet_trainer(tmp_path, callbacks=[BatchSizeFinder(max_memory_mb=1e-6)]).fit(Classifier())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here: catching a real out-of-memory needs one")  # fmt: skip
def test_batch_size_finder_catches_cuda_out_of_memory(tmp_path):
    class Huge(Classifier):
        def __init__(self):
            super().__init__(batch_size=2)
            self.net = nn.Sequential(nn.Linear(8, 2**20), nn.ReLU(), nn.Linear(2**20, 2))

        def train_dataloader(self):
            return DataLoader(blobs(2**16), batch_size=self.batch_size)

    finder = BatchSizeFinder(init_val=256, max_trials=30)
    quiet_trainer(tmp_path, accelerator="cuda", callbacks=[finder], max_steps=1).fit(Huge())
    assert None in finder.trials.values() and finder.optimal_batch_size >= 256


def test_lr_finder_suggests_a_rate_inside_the_range_and_writes_the_plot(tmp_path):
    finder, probe = LearningRateFinder(min_lr=1e-4, max_lr=10.0, num_training_steps=40), Probe()
    module = Classifier(batch_size=16)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = quiet_trainer(tmp_path, callbacks=[finder, probe], max_steps=0, logger=True)
    trainer.fit(module)
    assert 1e-4 <= finder.suggestion <= 10.0
    lrs = finder.results["lr"]
    assert lrs[0] == pytest.approx(1e-4) and all(b > a for a, b in zip(lrs, lrs[1:])) and len(lrs) <= 40
    assert probe.lr == pytest.approx(finder.suggestion) and module.hparams.lr == finder.suggestion
    assert all(torch.equal(before[k], probe.weights[k]) for k in before) and probe.optimizer_state == {}
    with open(finder.plot_path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.dirname(finder.plot_path) == trainer.log_dir
    with open(os.path.join(trainer.log_dir, "lr_find.csv")) as fh:
        assert len(list(csv.reader(fh))) == len(lrs) + 1


def test_lr_finder_without_matplotlib_still_writes_the_curve(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    finder = LearningRateFinder(num_training_steps=10, update_attr=False)
    with pytest.warns(UserWarning, match="install matplotlib"):
        quiet_trainer(tmp_path, callbacks=[finder], max_steps=0).fit(Classifier())
    assert finder.plot_path is None and os.path.exists(os.path.join(tmp_path, "lr_find.csv"))


def test_lr_scaling_rules():
    assert batch_scaling_factor(32, 128, True) == 4 and batch_scaling_factor(32, 128, "linear") == 4
    assert batch_scaling_factor(32, 128, "sqrt") == 2 and batch_scaling_factor(32, 128, False) == 1
    with pytest.raises(ConfigurationError):
        BatchSizeFinder(max_memory_mb=1, scale_lr="cubic")
