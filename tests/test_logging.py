"""``self.log`` in every mode: step/epoch defaults, weighting, reduce_fx, torchmetrics, prog_bar, loggers."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from helpers import Regressor, loader, quiet_trainer
from trainer.loggers import Logger
from trainer import ConfigurationError


class RecordingLogger(Logger):
    """A real Logger implementation that keeps what it receives."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict]] = []
        self.hparams: dict = {}
        self.status = None

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, metrics=None):
        self.hparams.update(params)

    def finalize(self, status):
        self.status = status


def _uneven_data() -> TensorDataset:
    # 10 samples in batches of 4, 4, 2: batch means differ so weighting matters.
    x = torch.arange(10, dtype=torch.float32).unsqueeze(1)
    return TensorDataset(x, x.clone())


class LogsBatchMean(Regressor):
    def __init__(self, **log_kwargs) -> None:
        super().__init__(features=1)
        self.log_kwargs = log_kwargs

    def training_step(self, batch, batch_idx):
        x, _ = batch
        self.log("value", x.mean(), **self.log_kwargs)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("val_value", x.mean(), **self.log_kwargs)


def test_training_defaults_log_per_step_and_validation_defaults_per_epoch():
    data = DataLoader(_uneven_data(), batch_size=4)
    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=1)
    trainer.fit(LogsBatchMean(), data, data)

    steps = [(step, m["value"]) for step, m in logger.metrics if "value" in m]
    assert steps == [(0, pytest.approx(1.5)), (1, pytest.approx(5.5)), (2, pytest.approx(8.5))]
    # validation: one epoch value, the mean over all 10 samples (weighted by batch size), not the mean of batch means
    val = [m["val_value"] for _, m in logger.metrics if "val_value" in m]
    assert val == [pytest.approx(4.5)]
    assert float(trainer.callback_metrics["val_value"]) == pytest.approx(4.5)
    assert float(trainer.callback_metrics["value"]) == pytest.approx(8.5)  # latest step value


def test_on_step_and_on_epoch_give_suffixed_keys_and_weighted_epoch_mean():
    data = DataLoader(_uneven_data(), batch_size=4)
    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=1, limit_val_batches=0)
    trainer.fit(LogsBatchMean(on_step=True, on_epoch=True), data)

    keys = set().union(*(m.keys() for _, m in logger.metrics))
    assert {"value_step", "value_epoch"} <= keys and "value" not in keys
    assert float(trainer.logged_metrics["value_epoch"]) == pytest.approx(4.5)
    assert float(trainer.callback_metrics["value"]) == pytest.approx(4.5)  # plain name → epoch value after the epoch


@pytest.mark.parametrize("reduce_fx, expected", [("sum", 1.5 + 5.5 + 8.5), ("max", 8.5), ("min", 1.5), (torch.max, 8.5)])
def test_reduce_fx(reduce_fx, expected):
    data = DataLoader(_uneven_data(), batch_size=4)
    trainer = quiet_trainer()
    result = trainer.validate(LogsBatchMean(reduce_fx=reduce_fx), data, verbose=False)
    assert result[0]["val_value"] == pytest.approx(expected)
    assert float(trainer.callback_metrics["val_value"]) == pytest.approx(expected)


def test_explicit_batch_size_weights_the_epoch_mean():
    class Weighted(Regressor):
        def validation_step(self, batch, batch_idx):
            self.log("v", float(batch_idx), batch_size=1 if batch_idx == 0 else 3)

    trainer = quiet_trainer()
    trainer.validate(Weighted(features=1), DataLoader(_uneven_data(), batch_size=4), verbose=False)
    assert float(trainer.callback_metrics["v"]) == pytest.approx((0 * 1 + 1 * 3 + 2 * 3) / 7)


def test_torchmetrics_metric_gives_exact_epoch_value_with_uneven_last_batch():
    class WithMetric(Regressor):
        def __init__(self):
            super().__init__(features=1)
            self.mae = torchmetrics.MeanAbsoluteError()

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.mae(x * 2, y)  # |2x - x| = x: epoch value is the mean of 0..9
            self.log("val_mae", self.mae)

    data = DataLoader(_uneven_data(), batch_size=4)
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=1)
    trainer.fit(WithMetric(), data, data)
    assert float(trainer.callback_metrics["val_mae"]) == pytest.approx(4.5)
    assert trainer.validate(WithMetric(), data, verbose=False)[0]["val_mae"] == pytest.approx(4.5)


def test_logged_values_do_not_keep_the_graph_and_prog_bar_metrics_are_floats():
    class Shows(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("shown", loss, prog_bar=True)
            self.log("hidden", loss * 2, logger=False)
            return loss

    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=1, limit_val_batches=0)
    trainer.fit(Shows(), loader(n=16))
    assert all(not v.requires_grad and v.grad_fn is None for v in trainer.callback_metrics.values())
    assert isinstance(trainer.progress_bar_metrics["shown"], float)
    assert "hidden" not in trainer.progress_bar_metrics and "hidden" in trainer.callback_metrics
    assert all("hidden" not in m for _, m in logger.metrics)


def test_log_every_n_steps_and_epoch_key_and_hparams():
    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=3, limit_val_batches=0)
    trainer.fit(Regressor(lr=0.01), loader(n=64, batch_size=8))  # 8 steps per epoch
    steps = [step for step, m in logger.metrics if "train_loss" in m]
    assert steps == [2, 5, 8, 11, 14]
    assert [m["epoch"] for step, m in logger.metrics if "train_loss" in m] == [0, 0, 1, 1, 1]
    assert logger.hparams["lr"] == 0.01
    assert logger.status == "success"


def test_logging_from_epoch_end_hooks_defaults_to_epoch():
    class EpochEnd(Regressor):
        def on_train_epoch_end(self):
            self.log("epoch_marker", float(self.current_epoch))

    trainer = quiet_trainer(max_epochs=2, limit_val_batches=0)
    trainer.fit(EpochEnd(), loader(n=16))
    assert float(trainer.logged_metrics["epoch_marker"]) == 1.0


@pytest.mark.parametrize(
    "value, message",
    [(torch.ones(3), "scalar"), ("text", "number, a scalar tensor"), (torch.tensor(1.0), "on_step=False and on_epoch=False")],
)
def test_invalid_log_calls(value, message):
    class Bad(Regressor):
        def training_step(self, batch, batch_idx):
            extra = {"on_step": False, "on_epoch": False} if "on_step" in message else {}
            self.log("bad", value, **extra)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ConfigurationError, match=message):
        quiet_trainer(max_epochs=1).fit(Bad(), loader(n=8))


def test_lightning_only_keywords_run_and_a_misspelt_option_is_an_error():
    class LightningStyle(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, enable_graph=False, sync_dist_group=None, rank_zero_only=True,
                     metric_attribute=None)  # fmt: skip
            self.log_dict({"twice": loss * 2}, rank_zero_only=True)
            return loss

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(LightningStyle(), loader(n=8))
    assert float(trainer.callback_metrics["twice"]) == pytest.approx(2 * float(trainer.callback_metrics["loss"]))

    class Misspelt(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, on_epcoh=True)
            return loss

    with pytest.raises(TypeError, match="on_epcoh"):
        quiet_trainer(max_epochs=1).fit(Misspelt(), loader(n=8))


def test_a_name_logged_with_new_options_keeps_its_epoch_state_and_takes_the_new_ones():
    """The same name logged per step and epoch, then (from batch 2 on) also to the progress bar: one epoch mean over
    every batch, and the progress-bar option applies from then on."""
    class Changes(LogsBatchMean):
        def training_step(self, batch, batch_idx):
            x, _ = batch
            self.log("value", x.mean(), on_epoch=True, prog_bar=batch_idx >= 2)
            return Regressor.training_step(self, batch, batch_idx)

    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(Changes(), DataLoader(_uneven_data(), batch_size=4))
    assert float(trainer.callback_metrics["value_epoch"]) == pytest.approx(4.5)  # weighted over all 10 samples
    assert "value_step" in trainer.progress_bar_metrics


def test_log_outside_a_trainer_warns_and_is_ignored():
    with pytest.warns(UserWarning, match="not run by a Trainer"):
        Regressor().log("x", 1.0)


def test_rank_zero_info_messages_show_by_default_in_a_plain_script():
    """A fresh interpreter with no logging set up: INFO messages reach stderr, as Lightning's do."""
    code = "from trainer import rank_zero_info, seed_everything; rank_zero_info('hello %s', 'there'); seed_everything(7)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["hello there", "Seed set to 7"]
