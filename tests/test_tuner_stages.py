"""The batch-size search in every stage, as a Lightning project runs it: ``Tuner.scale_batch_size(method=...)`` and
``BatchSizeFinder`` in ``validate``/``test``/``predict`` search with that stage's steps, and the stage then runs on
a loader with the size found; a fit search requests the validation loaders again. Also the learning-rate finder's
Lightning behaviours: ``suggestion(skip_begin, skip_end)``, steps whose ``training_step`` returns ``None``, and a
range given from high to low."""
from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import ConfigurationError, Trainer, TrainModule
from trainer.callbacks import BatchSizeFinder
from trainer.tuner import Tuner


def dataset(n: int = 64) -> TensorDataset:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


class EvalModel(TrainModule):
    """Reads ``self.batch_size`` in every ``*_dataloader`` and records the batch sizes each step sees."""

    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.layer = nn.Linear(4, 1)
        self.seen: dict[str, list[int]] = {"train": [], "val": [], "test": [], "predict": []}

    def _loader(self) -> DataLoader:
        return DataLoader(dataset(), batch_size=self.batch_size)

    train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader

    def training_step(self, batch, batch_idx):
        self.seen["train"].append(len(batch[0]))
        return F.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.seen["val"].append(len(batch[0]))
        self.log("batches", 1.0, reduce_fx="sum")

    def test_step(self, batch, batch_idx):
        self.seen["test"].append(len(batch[0]))
        self.log("batches", 1.0, reduce_fx="sum")

    def predict_step(self, batch, batch_idx):
        self.seen["predict"].append(len(batch[0]))
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_trainer(tmp_path, **kwargs) -> Trainer:
    kwargs = {"accelerator": "cpu", "devices": 1, "max_epochs": 1, "default_root_dir": tmp_path, "logger": False,
              "enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False, **kwargs}
    return Trainer(**kwargs)


@pytest.mark.parametrize(("method", "seen"), [("validate", "val"), ("test", "test"), ("predict", "predict")])
def test_tuner_searches_with_the_steps_of_the_evaluation_method(tmp_path, method, seen):
    model = EvalModel()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = make_trainer(tmp_path)
    size = Tuner(trainer).scale_batch_size(model, method=method, max_trials=4, steps_per_trial=1)
    assert size == model.batch_size == 16  # 2, 4, 8, 16: four trials that all fit
    assert model.seen[seen] == [2, 4, 8, 16]  # one step per trial, then the Tuner's run ends
    assert model.seen["train"] == [] and trainer.global_step == 0
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_batch_size_finder_callback_runs_the_test_with_the_size_found_and_drops_the_trials_logs(tmp_path):
    model = EvalModel()
    trainer = make_trainer(tmp_path, callbacks=[BatchSizeFinder(mode="power", max_trials=3, steps_per_trial=2)])
    [metrics] = trainer.test(model, verbose=False)
    assert trainer.test_dataloaders.batch_size == model.batch_size == 8
    assert model.seen["test"] == [2, 2, 4, 4, 8, 8] + [8] * 8  # the trials, then the whole test at 8
    assert metrics["batches"] == 8  # only the real test's steps logged
    predictions = make_trainer(tmp_path, callbacks=[BatchSizeFinder(mode="power", max_trials=2)]).predict(EvalModel())
    assert [len(p) for p in predictions] == [4] * 16


def test_fits_validation_runs_with_the_size_found_for_training(tmp_path):
    model = EvalModel()
    trainer = make_trainer(tmp_path, callbacks=[BatchSizeFinder(mode="power", max_trials=2, steps_per_trial=1)],
                           num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model)
    assert model.seen["train"][:2] == [2, 4] and set(model.seen["train"][2:]) == {4}
    assert set(model.seen["val"]) == {4}  # no search in fit's validation; its loaders were requested again
    assert trainer.val_dataloaders.batch_size == 4


def test_a_fit_search_says_each_step_and_reloads_the_validation_loaders(tmp_path, caplog):
    model = EvalModel(batch_size=16)
    trainer = make_trainer(tmp_path)
    with caplog.at_level(logging.INFO):
        size = Tuner(trainer).scale_batch_size(model, init_val=8, max_trials=2, steps_per_trial=1, mode="power")
    assert size == 16 and caplog.text.count("Batch size 8 succeeded, trying batch size 16") == 1
    assert trainer.train_dataloader.batch_size == trainer.val_dataloaders.batch_size == 16
    caplog.clear()
    with caplog.at_level(logging.INFO):
        Tuner(make_trainer(tmp_path)).scale_batch_size(EvalModel(), init_val=64, steps_per_trial=1)
    assert "The batch size 64 is greater or equal than the length of your dataset: 64." in caplog.text
    assert "trying batch size" not in caplog.text


def test_misuse_of_the_batch_size_search_is_refused_in_lightnings_words(tmp_path):
    tuner, loader = Tuner(make_trainer(tmp_path)), DataLoader(dataset(), batch_size=2)
    with pytest.raises(ValueError, match="method 'prediction' is invalid"):
        tuner.scale_batch_size(EvalModel(), method="prediction")
    with pytest.raises(ConfigurationError, match="please consider setting `dataloaders` instead"):
        tuner.scale_batch_size(EvalModel(), method="test", train_dataloaders=loader)
    with pytest.raises(ConfigurationError, match="setting `train_dataloaders` and `val_dataloaders` instead"):
        tuner.scale_batch_size(EvalModel(), dataloaders=loader)
    with pytest.raises(ValueError, match="should be either of"):
        tuner.scale_batch_size(EvalModel(), mode="doubling")

    class TwoLoaders(EvalModel):
        def val_dataloader(self):
            return [self._loader(), self._loader()]

    with pytest.raises(ConfigurationError, match="cannot be used with multiple val dataloaders"):
        tuner.scale_batch_size(TwoLoaders(), method="validate")
    ddp = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    with pytest.raises(ConfigurationError, match="not supported with distributed strategies"):
        BatchSizeFinder().setup(ddp, EvalModel())  # Lightning's users call it without a stage


class LRModel(TrainModule):
    def __init__(self, skip_steps: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.lr = 0.01
        self.skip_steps = skip_steps
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step in self.skip_steps:
            return None  # skip this step, as a Lightning module may
        return F.mse_loss(self.layer(batch[0]), batch[1])

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=8)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def test_lr_find_suggestion_follows_the_skipped_points_and_steps_returning_none(tmp_path):
    torch.manual_seed(0)
    model = LRModel(skip_steps=(5, 12))
    result = Tuner(make_trainer(tmp_path)).lr_find(model, num_training=30, early_stop_threshold=None)
    lrs, losses = result.results["lr"], result.results["loss"]
    assert len(lrs) == len(losses) == 30  # the skipped steps count, with no loss
    assert math.isnan(losses[5]) and math.isnan(losses[12]) and math.isfinite(losses[6])
    assert model.lr == result.suggestion() and math.isfinite(model.lr)
    assert result.suggestion(skip_begin=25) in lrs[25:29]  # only the points the skips leave
    assert result.suggestion(skip_begin=10, skip_end=19) is None  # one point left: no gradient


def test_lr_find_runs_a_range_given_high_to_low_downwards(tmp_path):
    with pytest.warns(UserWarning, match="falls during the range test"):
        result = Tuner(make_trainer(tmp_path)).lr_find(LRModel(), min_lr=1.0, max_lr=1e-6, num_training=5)
    assert result.results["lr"][0] == 1.0 and result.results["lr"] == sorted(result.results["lr"], reverse=True)
    assert all(1e-6 <= lr <= 1.0 for lr in result.results["lr"])
