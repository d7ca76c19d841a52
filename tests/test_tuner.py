"""``Tuner(trainer).lr_find(model)`` and ``Tuner(trainer).scale_batch_size(model)`` as a Lightning project calls
them: the fit the Tuner starts ends after the search, the result has ``results``/``suggestion()``/``plot()``,
the module's ``lr``/``batch_size`` are set, and the next ``fit`` trains with them."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import ConfigurationError, Trainer, TrainModule
from trainer.callbacks import Callback, LearningRateFinder, ModelCheckpoint
from trainer.tuner import Tuner


def dataset(n: int = 64) -> TensorDataset:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))


class LitModel(TrainModule):
    def __init__(self, lr: float = 1e-3, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, 1)
        self.optimizer_lrs: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=self.hparams.batch_size)

    def configure_optimizers(self):
        self.optimizer_lrs.append(self.hparams.lr)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class CountsTraining(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1


def make_trainer(tmp_path, *callbacks: Callback) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=tmp_path, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks))  # fmt: skip


def test_lr_find_returns_the_curve_and_sets_the_learning_rate_the_next_fit_uses(tmp_path):
    counter = CountsTraining()
    trainer = make_trainer(tmp_path, counter)
    model = LitModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lr_finder = Tuner(trainer).lr_find(model, min_lr=1e-4, max_lr=1.0, num_training=30)

    assert counter.batches == 0 and trainer.global_step == 0  # the search trained nothing for real
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(lr_finder.results["lr"]) == len(lr_finder.results["loss"]) > 3
    suggestion = lr_finder.suggestion()
    assert suggestion is not None and 1e-4 <= suggestion <= 1.0
    assert model.hparams.lr == suggestion
    assert lr_finder.suggestion(skip_begin=0, skip_end=0) is not None
    figure = lr_finder.plot(suggest=True)
    assert figure.axes[0].get_xscale() == "log" and figure.axes[0].get_xlabel() == "Learning rate"
    assert not any(isinstance(cb, LearningRateFinder) for cb in trainer.callbacks)

    trainer.fit(model)
    assert counter.batches == 16 and model.optimizer_lrs[-1] == suggestion


def test_lr_find_refuses_a_module_without_a_learning_rate_and_a_second_finder(tmp_path):
    class NoLr(LitModel):
        def __init__(self):
            super().__init__()
            del self.hparams["lr"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    with pytest.raises(ConfigurationError, match="`lr` or `learning_rate`"):
        Tuner(make_trainer(tmp_path)).lr_find(NoLr())
    assert Tuner(make_trainer(tmp_path)).lr_find(NoLr(), update_attr=False, num_training=10) is not None
    with pytest.raises(ConfigurationError, match="already has a LearningRateFinder"):
        Tuner(make_trainer(tmp_path, LearningRateFinder())).lr_find(LitModel())
    with pytest.raises(ConfigurationError, match="only method='fit'"):
        Tuner(make_trainer(tmp_path)).lr_find(LitModel(), method="validate")


def test_the_learning_rate_finder_callback_has_lightnings_optimal_lr(tmp_path):
    finder = LearningRateFinder(num_training_steps=20)
    trainer = make_trainer(tmp_path, finder)
    trainer.fit(LitModel())
    assert finder.optimal_lr.suggestion() == finder.suggestion and finder.optimal_lr.results["lr"]


def test_scale_batch_size_returns_the_largest_that_fits_and_sets_it(tmp_path):
    counter = CountsTraining()
    trainer = make_trainer(tmp_path, counter, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True))
    model = LitModel()
    size = Tuner(trainer).scale_batch_size(model, init_val=2, max_memory_mb=100, max_trials=10)
    assert size == 64  # nothing runs short of memory here: it stops at the dataset's size
    assert model.hparams.batch_size == 64 and counter.batches == 0
    assert not (tmp_path / "ckpt").exists()  # the Tuner's fit ended before any checkpoint

    power = Tuner(make_trainer(tmp_path)).scale_batch_size(LitModel(), mode="power", max_memory_mb=0.0015)
    binsearch = Tuner(make_trainer(tmp_path)).scale_batch_size(LitModel(), mode="binsearch", max_memory_mb=0.0015,
                                                               margin=0.0)  # fmt: skip
    assert power is not None and binsearch >= power  # binsearch refines between the last fit and the first miss
    safer = Tuner(make_trainer(tmp_path)).scale_batch_size(LitModel(), mode="binsearch", max_memory_mb=0.0015)
    assert safer == int(binsearch * 0.95)  # Lightning's default margin: 5% below the largest that fitted
    # Without a budget on CPU (as in Lightning) no trial fails: it stops at the dataset's size (or max_val).
    assert Tuner(make_trainer(tmp_path)).scale_batch_size(LitModel(), max_val=16) == 16
    assert Tuner(make_trainer(tmp_path)).scale_batch_size(LitModel()) == 64


def test_under_fast_dev_run_both_searches_are_skipped_with_lightnings_warning(tmp_path):
    counter = CountsTraining()
    trainer = Trainer(accelerator="cpu", devices=1, default_root_dir=tmp_path, fast_dev_run=True, max_epochs=2,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[counter])  # fmt: skip
    model = LitModel(lr=0.1, batch_size=8)
    with pytest.warns(UserWarning, match="Skipping learning rate finder since `fast_dev_run` is enabled."):
        assert Tuner(trainer).lr_find(model) is None
    with pytest.warns(UserWarning, match="Skipping batch size scaler since `fast_dev_run` is enabled."):
        assert Tuner(trainer).scale_batch_size(model) is None
    assert (model.hparams.lr, model.hparams.batch_size) == (0.1, 8)  # untouched
    assert counter.batches == 0  # the Tuner's fits end without training

    class NoRate(LitModel):  # nothing to set a suggestion on: skipped all the same, as in Lightning
        def __init__(self):
            super().__init__()
            del self.hparams["lr"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.warns(UserWarning, match="Skipping learning rate finder"):
        assert Tuner(trainer).lr_find(NoRate()) is None
