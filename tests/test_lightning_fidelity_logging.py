"""Lightning 2.6's observable logging behaviour, written as a Lightning user writes a module or callback (second
measurement of Lightning's own public-API tests)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import Trainer, TrainModule
from trainer.callbacks import ModelCheckpoint
from ui_fixtures import blobs


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.layer(x), y)
        self.log("my_loss", loss)  # on_step only: the default in training_step
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.layer(x), y))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(64), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(blobs(16), batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_training_step_value_is_monitorable_at_a_mid_epoch_validation(tmp_path):
    # val_check_interval=0.25 validates after 4 of 16 batches, before the first logging interval (50 steps):
    # the training step's latest value is in callback_metrics, so the checkpoint finds its monitor.
    seen = []

    class Watch(ModelCheckpoint):
        def on_validation_end(self, trainer: Any, module: Any) -> None:
            if not trainer.sanity_checking:
                seen.append(float(trainer.callback_metrics["my_loss"]))
            super().on_validation_end(trainer, module)

    checkpoint = Watch(dirpath=tmp_path, monitor="my_loss", save_top_k=2)
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, val_check_interval=0.25, callbacks=[checkpoint],
                      logger=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Net())
    assert len(seen) == 4 and len(list(tmp_path.glob("*.ckpt"))) == 2
    assert checkpoint.best_model_score is not None


def test_hyperparameters_saved_with_logger_false_are_not_sent_to_the_logger(tmp_path):
    from trainer.loggers import CSVLogger

    sent = []

    class Recording(CSVLogger):
        def log_hyperparams(self, params: Any = None, metrics: Any = None) -> None:
            sent.append(dict(params or {}))

    class Quiet(Net):
        def __init__(self, width: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters(logger=False)

    trainer = Trainer(default_root_dir=tmp_path, max_steps=1, limit_val_batches=0, logger=Recording(tmp_path),
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    module = Quiet()
    trainer.fit(module)
    assert sent == [] and module.hparams.width == 3  # still in hparams (and checkpoints)


def test_logger_root_dir_and_log_hyperparams_without_arguments(tmp_path):
    from trainer.loggers import CSVLogger, TensorBoardLogger
    from trainer.loggers.logger import DummyLogger

    for name in ("", None):
        csv = CSVLogger(save_dir=tmp_path / "csv", name=name)
        csv.log_hyperparams()
        assert csv.root_dir == str(tmp_path / "csv") and (tmp_path / "csv" / "version_0").is_dir()
    assert TensorBoardLogger(save_dir=tmp_path, name="exp").root_dir == str(tmp_path / "exp")
    DummyLogger().log_hyperparams("1", 2, three="three")  # the fast_dev_run logger takes anything
    DummyLogger().log_metrics("1", 2, three="three")


def test_csv_loggers_experiment_is_lightnings_writer(tmp_path):
    from trainer.loggers.csv_logs import CSVLogger, ExperimentWriter

    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=2)
    logger.log_metrics({"a": 1.0}, step=0)
    writer = logger.experiment
    assert isinstance(writer, ExperimentWriter) and writer.metrics == [{"step": 0, "a": 1.0}]
    logger.log_metrics({"a": 2.0}, step=1)  # the second row flushes: nothing left buffered
    assert not logger.experiment.metrics
    writer.log_metrics({"b": 3.0})
    writer.save()
    with open(writer.metrics_file_path) as fh:
        assert fh.readline().strip().split(",") == ["step", "a", "b"]
    assert writer.metrics_file_path == str(tmp_path / "logs" / "version_0" / ExperimentWriter.NAME_METRICS_FILE)


def test_hparams_yaml_reads_back_with_lightnings_helpers(tmp_path):
    from argparse import Namespace

    import pytest

    from trainer.core.saving import load_hparams_from_yaml, save_hparams_to_yaml
    from trainer.loggers import CSVLogger

    logger = CSVLogger(tmp_path)
    logger.log_hyperparams({"lr": 0.1, "layers": [1, 2], "nested": {"a": "b"}})
    assert load_hparams_from_yaml(f"{logger.log_dir}/hparams.yaml") == {"lr": 0.1, "layers": [1, 2],
                                                                         "nested": {"a": "b"}}  # fmt: skip
    save_hparams_to_yaml(tmp_path / "ns.yaml", Namespace(a=1, b="x"))
    assert load_hparams_from_yaml(tmp_path / "ns.yaml") == {"a": 1, "b": "x"}
    with pytest.warns(UserWarning, match="Missing Tags"):
        assert load_hparams_from_yaml(tmp_path / "absent.yaml") == {}


def test_self_log_in_a_callback_logs_through_the_module(tmp_path):
    from trainer.callbacks import Callback

    class Logging(Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.log("on_train_start", 1.0)

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.log_dict({"on_train_batch_end": 3.0})

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            self.log("on_train_epoch_end", 5.0)

    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0,
                      callbacks=[Logging()], logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)  # fmt: skip
    trainer.fit(Net())
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("on_")}
    assert metrics == {"on_train_start": 1.0, "on_train_batch_end": 3.0, "on_train_epoch_end": 5.0}
