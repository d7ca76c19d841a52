"""Lightning's last behaviours after the rename: a CombinedLoader of plain lists, a logged metric the module does
not hold, the TQDM bar's bars, ModelCheckpoint creating nothing on set-up, a ``dataloader_idx`` with one loader, and
Lightning's key phrases in the refusals ported ``pytest.raises(match=...)`` look for."""
from __future__ import annotations

import os

import pytest
import torch

from trainer import CombinedLoader, Trainer
from trainer.callbacks import ModelCheckpoint, TQDMProgressBar
from trainer.demos import BoringModel
from trainer.plugins import TorchSyncBatchNorm
from trainer.strategies.errors import ConfigurationError


def quiet(**kwargs) -> Trainer:
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False)  # fmt: skip
    return Trainer(**{**options, **kwargs})


def test_a_combined_loader_of_plain_lists_and_sets_yields_their_items():
    seen = []

    class Model(BoringModel):
        def validation_step(self, batch, batch_idx):
            seen.append(batch)

    quiet().validate(Model(), CombinedLoader({"a": [0, 1, 2], "b": {3, 4}}))
    assert seen == [{"a": 0, "b": 3}, {"a": 1, "b": 4}]


def test_logging_a_metric_the_module_does_not_hold_is_refused():
    torchmetrics = pytest.importorskip("torchmetrics", reason="the check is about torchmetrics.Metric objects")

    class Model(BoringModel):
        def __init__(self, held: bool):
            super().__init__()
            self.held = torchmetrics.MeanMetric() if held else None

        def training_step(self, batch, batch_idx):
            metric = self.held if self.held is not None else torchmetrics.MeanMetric()
            metric.update(torch.tensor(1.0))
            self.log("foo", metric)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ConfigurationError, match="Could not find the `LightningModule` attribute for the `torchmetrics"):
        quiet(fast_dev_run=1).fit(Model(held=False))
    quiet(fast_dev_run=1).fit(Model(held=True))  # an attribute: logged as before


def test_the_progress_bar_has_lightnings_bars(tmp_path):
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                      enable_model_summary=False, max_epochs=1, limit_train_batches=5, limit_val_batches=3,
                      callbacks=[TQDMProgressBar()])  # fmt: skip
    bar = trainer.progress_bar_callback
    with pytest.raises(TypeError, match="reference has not been set yet"):
        bar.train_progress_bar
    trainer.fit(BoringModel())
    assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (5, 5)
    assert (bar.val_progress_bar.n, bar.val_progress_bar.total) == (3, 3)
    assert bar.train_progress_bar.desc.startswith("Epoch 1")


def test_model_checkpoint_setup_creates_nothing_until_it_saves(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint = ModelCheckpoint()
    checkpoint.setup(Trainer(accelerator="cpu"), BoringModel(), stage="fit")
    assert checkpoint.dirpath == os.path.realpath(tmp_path / "logs" / "version_0" / "checkpoints")
    assert os.listdir(tmp_path) == []


def test_a_step_that_requires_dataloader_idx_with_one_loader_is_explained():
    class Model(BoringModel):
        def validation_step(self, batch, batch_idx, dataloader_idx):
            return super().validation_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="You provided only a single `val_dataloader`, but have included "
                                           "`dataloader_idx` in `Model.validation_step\\(\\)`"):  # fmt: skip
        quiet().validate(Model())


@pytest.mark.parametrize(
    "kwargs, phrase",
    [
        (dict(accelerator="abacus"), "You selected an invalid accelerator name: `accelerator='abacus'`"),
        (dict(accelerator="cuda", devices=0), "value is not a valid input using"),
        (dict(devices=[]), "value is not a valid input using"),
        (dict(precision="17"), "Precision '17' is invalid. Allowed precision values"),
        (dict(plugins=[object()]), "Found invalid type for plugin"),
        (dict(plugins=[TorchSyncBatchNorm(), TorchSyncBatchNorm()]), "Received multiple values for"),
        (dict(sync_batchnorm=True, plugins=[TorchSyncBatchNorm()]), "but this is not allowed. Choose one or the other"),
    ],
)
def test_refusals_carry_lightnings_key_phrase(kwargs, phrase):
    with pytest.raises(ConfigurationError, match=phrase.replace("(", "\\(").replace(")", "\\)")):
        quiet(**kwargs)


@pytest.mark.parametrize(
    "trainer_kwargs, call, phrase",
    [
        (dict(gradient_clip_val=0.5), dict(gradient_clip_val=1.0),
         r"You have set `Trainer\(gradient_clip_val=0.5\)` and have passed `clip_gradients\(gradient_clip_val=1.0\)`"),
        (dict(gradient_clip_val=0.5, gradient_clip_algorithm="norm"), dict(gradient_clip_algorithm="value"),
         "Please use only one of them"),
        ({}, dict(gradient_clip_val=1.0, gradient_clip_algorithm="foo"), "`gradient_clip_algorithm` foo is invalid"),
    ],
)
def test_clip_gradients_misuse_carries_lightnings_key_phrase(trainer_kwargs, call, phrase):
    class Model(BoringModel):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.clip_gradients(optimizer, **call)

    with pytest.raises(ConfigurationError, match=phrase):
        quiet(fast_dev_run=1, **trainer_kwargs).fit(Model())
