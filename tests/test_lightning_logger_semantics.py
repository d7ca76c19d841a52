"""What a ported project's loggers receive and what the Trainer's metric dicts hold, as on Lightning: a custom
``Logger``'s calls, TensorBoard's ``hp_metric`` and ``sub_dir``, the CSV logger over an earlier run's folder,
``self.log`` refusals in Lightning's words, and metrics that do not leak from one stage into the next."""
from __future__ import annotations

import csv
import os

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Trainer, TrainModule
from trainer.callbacks import ModelCheckpoint
from trainer.loggers import CSVLogger, Logger, TensorBoardLogger
from trainer.utilities.exceptions import MisconfigurationException


def data(n: int = 8) -> DataLoader:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class LitRegressor(TrainModule):
    def __init__(self, lr: float = 0.05, save_hparams: bool = True) -> None:
        super().__init__()
        if save_hparams:
            self.save_hyperparameters()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", F.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class RecordingLogger(Logger):
    """A user's own logger, written against Lightning's ``Logger`` API."""

    def __init__(self):
        self.hparams_logged = None
        self.metrics_logged = []
        self.saved_checkpoints = []
        self.finalized_status = None

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return "1"

    def log_hyperparams(self, params, *args, **kwargs):
        self.hparams_logged = params

    def log_metrics(self, metrics, step=None):
        self.metrics_logged.append((step, dict(metrics)))

    def after_save_checkpoint(self, checkpoint_callback):
        self.saved_checkpoints.append(os.path.basename(checkpoint_callback.best_model_path))

    def finalize(self, status):
        self.finalized_status = status


def fit(tmp_path, module, logger, **kwargs):
    settings = dict(default_root_dir=tmp_path, accelerator="cpu", max_epochs=2, log_every_n_steps=1,
                    enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    settings.update(kwargs)
    trainer = Trainer(logger=logger, **settings)
    trainer.fit(module, data(), data())
    return trainer


def test_custom_logger_receives_lightnings_calls(tmp_path):
    with_hparams, without = RecordingLogger(), RecordingLogger()
    fit(tmp_path, LitRegressor(), [with_hparams, without],
        callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="{epoch}")])  # fmt: skip
    assert with_hparams.hparams_logged == {"lr": 0.05, "save_hparams": True}
    assert with_hparams.saved_checkpoints == ["epoch=0.ckpt", "epoch=1.ckpt"]  # after each save
    assert with_hparams.finalized_status == "success"
    assert (1, without.metrics_logged[1][1]) == without.metrics_logged[1] and "train_loss" in without.metrics_logged[1][1]

    plain = RecordingLogger()
    fit(tmp_path, LitRegressor(save_hparams=False), plain)
    assert plain.hparams_logged is None  # nothing saved with save_hyperparameters: log_hyperparams is not called


def test_tensorboard_hp_metric_placeholder_and_sub_dir(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb", sub_dir="run_a")
    trainer = fit(tmp_path, LitRegressor(), logger)
    assert logger.log_dir == os.path.join(tmp_path, "tb", "version_0", "run_a")
    assert trainer.log_dir == logger.log_dir
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert [e.value for e in events.Scalars("hp_metric")] == [-1.0]
    assert os.path.isfile(os.path.join(logger.log_dir, "hparams.yaml"))

    quiet = TensorBoardLogger(tmp_path, name="tb", default_hp_metric=False)
    fit(tmp_path, LitRegressor(), quiet)
    events = EventAccumulator(quiet.log_dir)
    events.Reload()
    assert "hp_metric" not in events.Tags()["scalars"]


def test_tensorboard_log_dir_follows_overridden_name_and_version(tmp_path):
    class Named(TensorBoardLogger):
        @property
        def name(self):
            return "fixed"

        @property
        def version(self):
            return "release"

    assert Named(tmp_path).log_dir == os.path.join(tmp_path, "fixed", "release")


def test_csv_logger_over_an_earlier_runs_folder_warns_and_starts_afresh(tmp_path):
    first = CSVLogger(tmp_path, name="exp", version=0)
    first.log_metrics({"a": 1.0}, step=0)
    first.save()
    again = CSVLogger(tmp_path, name="exp", version=0)
    with pytest.warns(UserWarning, match="exists and is not empty"):
        again.log_metrics({"b": 2.0}, step=0)
    again.save()
    with open(again.metrics_file_path, newline="") as fh:
        assert list(csv.DictReader(fh)) == [{"step": "0", "b": "2.0"}]


def test_logged_epoch_key_wins_and_reaches_logged_metrics(tmp_path):
    class LogsEpoch(LitRegressor):
        def training_step(self, batch, batch_idx):
            self.log("epoch", -batch_idx - 1.0)
            return super().training_step(batch, batch_idx)

    trainer = fit(tmp_path, LogsEpoch(), RecordingLogger(), max_epochs=1, log_every_n_steps=50)
    assert trainer.logged_metrics["epoch"] == -2  # the last batch's, though the loggers were not written per step
    logger = RecordingLogger()
    fit(tmp_path, LogsEpoch(), logger, max_epochs=1, log_every_n_steps=1)
    per_step = [(step, metrics["epoch"]) for step, metrics in logger.metrics_logged if "train_loss" in metrics]
    assert per_step == [(0, -1.0), (1, -2.0)]  # the logged value, not the automatic epoch number


def test_each_stage_starts_without_the_previous_stages_metrics(tmp_path):
    trainer = fit(tmp_path, LitRegressor(), False, max_epochs=1)
    assert {"train_loss", "val_loss"} <= set(trainer.callback_metrics)
    trainer.test(trainer.lightning_module, data(), verbose=False)
    assert set(trainer.callback_metrics) == {"test_loss"}
    assert set(trainer.logged_metrics) == {"test_loss"}


@pytest.mark.parametrize(("value", "kwargs", "phrase"), [
    (None, {}, "`self.log(bad, None)` was called"),
    ("text", {}, "`self.log(bad, text)` was called"),
    (torch.ones(2), {}, "tensor must have a single element"),
    (1.0, {"on_step": False, "on_epoch": False}, "is not useful"),
    (1.0, {"reduce_fx": torch.argmax}, r"reduce_fx={min,max,mean,sum}\)` are supported"),
])  # fmt: skip
def test_self_log_refusals_keep_lightnings_phrases(tmp_path, value, kwargs, phrase):
    class Bad(LitRegressor):
        def training_step(self, batch, batch_idx):
            self.log("bad", value, **kwargs)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match=phrase if "\\" in phrase else phrase.replace("(", r"\(")
                       .replace(")", r"\)")):  # fmt: skip
        fit(tmp_path, Bad(), False, max_epochs=1)
    assert issubclass(MisconfigurationException, ValueError)  # Lightning raises ValueError for the values


def test_dataloader_idx_in_a_logged_name_is_refused(tmp_path):
    class Suffixed(LitRegressor):
        def training_step(self, batch, batch_idx):
            self.log("foo/dataloader_idx_0", 1.0)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match="`self.log` with the key `foo/dataloader_idx_0`"):
        fit(tmp_path, Suffixed(), False, max_epochs=1)


def test_clashing_module_and_datamodule_hparams_are_refused(tmp_path):
    class Data(DataModule):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return data()

    with pytest.raises(RuntimeError, match=r"Error while merging hparams: the keys \['lr'\]"):
        Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, logger=RecordingLogger(),
                enable_progress_bar=False).fit(LitRegressor(), datamodule=Data())  # fmt: skip


def test_csv_logger_writes_to_an_fsspec_url(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    root = f"memory://{tmp_path.name}-csv"
    fs, _ = fsspec.core.url_to_fs(root)
    first = CSVLogger(save_dir=root, flush_logs_every_n_steps=3)
    trainer = fit(tmp_path, LitRegressor(), first, enable_checkpointing=False)
    assert first.log_dir == f"{root}/logs/version_0" and trainer.log_dir == first.log_dir
    with fs.open(f"{first.log_dir}/metrics.csv", "r") as fh:
        rows = list(csv.DictReader(fh))
    assert [row["step"] for row in rows if row["train_loss"]] == ["0", "1", "2", "3"]  # every flush kept
    assert sum(1 for row in rows if row["val_loss"]) == 2  # the column added later, earlier rows left empty
    assert fs.isfile(f"{first.log_dir}/hparams.yaml")
    second = CSVLogger(save_dir=root)
    second.log_metrics({"loss": 0.5}, step=0)
    second.save()
    assert second.version == 1 and fs.isfile(f"{root}/logs/version_1/metrics.csv")
    assert not os.path.exists("memory:")  # nothing went to a local folder named after the URL
