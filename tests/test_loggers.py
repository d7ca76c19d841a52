"""Loggers write what users read back: TensorBoard event files, metrics.csv, hparams.yaml (issue 8)."""
from __future__ import annotations

import csv
import glob
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from ui_fixtures import TinyModule, loader, quiet_trainer

import trainer.loggers as loggers
from trainer.loggers import CSVLogger, TensorBoardLogger
from trainer.strategies.rank import rank_zero_only


def read_events(log_dir: str) -> EventAccumulator:
    accumulator = EventAccumulator(log_dir)
    accumulator.Reload()
    return accumulator


def read_csv(path: str) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def test_tensorboard_and_csv_record_the_same_scalars_at_the_trainers_steps(tmp_path):
    tb, csv_logger = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    trainer = quiet_trainer(tmp_path, logger=[tb, csv_logger], log_every_n_steps=2, max_epochs=2)
    trainer.fit(TinyModule(), loader(64, 8), loader(32, 8))  # 8 steps per epoch

    events = read_events(tb.log_dir)
    assert {"train_loss", "val_loss", "val_acc", "epoch"} <= set(events.Tags()["scalars"])
    train = events.Scalars("train_loss")
    assert [e.step for e in train] == [1, 3, 5, 7, 9, 11, 13, 15]  # every 2nd optimizer step, 0-based
    assert train[-1].value == pytest.approx(float(trainer.logged_metrics["train_loss"]), rel=1e-6)
    val = events.Scalars("val_loss")
    assert [e.step for e in val] == [7, 15]  # end of each epoch
    assert val[-1].value == pytest.approx(float(trainer.callback_metrics["val_loss"]), rel=1e-6)

    columns, rows = read_csv(csv_logger.metrics_file_path)
    assert columns[0] == "step" and {"train_loss", "val_loss", "val_acc", "epoch"} <= set(columns)
    csv_train = [(int(r["step"]), float(r["train_loss"])) for r in rows if r["train_loss"]]
    assert [s for s, _ in csv_train] == [e.step for e in train]
    assert [v for _, v in csv_train] == pytest.approx([e.value for e in train], rel=1e-6)


def test_tensorboard_hparams_carry_the_final_metric_names_and_status(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    trainer = quiet_trainer(tmp_path, logger=logger, log_every_n_steps=4)
    trainer.fit(TinyModule(lr=0.05, hidden=12), loader(), loader(16))

    content = read_events(logger.log_dir).PluginTagToContent("hparams")
    plugin = {tag.split("/")[-1]: HParamsPluginData.FromString(data) for tag, data in content.items()}
    start = plugin["session_start_info"].session_start_info
    assert start.hparams["lr"].number_value == pytest.approx(0.05)
    assert start.hparams["hidden"].number_value == 12
    metric_tags = {m.name.tag for m in plugin["experiment"].experiment.metric_infos}
    assert {"train_loss", "val_loss", "val_acc"} <= metric_tags and "epoch" not in metric_tags
    assert plugin["session_end_info"].session_end_info.status == 1  # STATUS_SUCCESS

    with open(os.path.join(logger.log_dir, "hparams.yaml")) as fh:
        assert yaml.safe_load(fh) == {"lr": 0.05, "hidden": 12, "scheduler": None}


class FailingModule(TinyModule):
    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise ValueError("boom")
        return super().training_step(batch, batch_idx)


def test_a_failed_run_flushes_its_scalars_and_says_it_failed(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    with pytest.raises(ValueError, match="boom"):
        quiet_trainer(tmp_path, logger=logger, log_every_n_steps=1).fit(FailingModule(), loader())
    events = read_events(logger.log_dir)
    assert [e.step for e in events.Scalars("train_loss")] == [0, 1, 2]
    end = HParamsPluginData.FromString(events.PluginTagToContent("hparams")["_hparams_/session_end_info"])
    assert end.session_end_info.status == 2  # STATUS_FAILURE


def test_each_run_gets_the_next_version_folder_and_logger_true_means_tensorboard(tmp_path):
    first = quiet_trainer(tmp_path, logger=True)
    second = quiet_trainer(tmp_path, logger=True)
    assert isinstance(first.logger, TensorBoardLogger)
    first.fit(TinyModule(), loader())
    second.fit(TinyModule(), loader())
    assert first.log_dir == os.path.join(tmp_path, "logs", "version_0")
    assert second.log_dir == os.path.join(tmp_path, "logs", "version_1")
    for trainer in (first, second):
        assert glob.glob(os.path.join(trainer.log_dir, "events.out.tfevents.*"))
    assert TensorBoardLogger(tmp_path, version=7).log_dir == os.path.join(tmp_path, "logs", "version_7")
    assert TensorBoardLogger(tmp_path, name="", version="exp-a").log_dir == os.path.join(tmp_path, "exp-a")


def test_two_loggers_of_one_run_under_one_name_share_its_version_folder(tmp_path):
    (tmp_path / "exp" / "version_0").mkdir(parents=True)  # an earlier run
    tb, csv_logger = TensorBoardLogger(tmp_path, name="exp"), CSVLogger(tmp_path, name="exp")
    quiet_trainer(tmp_path, logger=[tb, csv_logger]).fit(TinyModule(), loader(), loader())
    assert tb.log_dir == csv_logger.log_dir == os.path.join(tmp_path, "exp", "version_1")
    assert sorted(os.listdir(tmp_path / "exp")) == ["version_0", "version_1"]
    assert glob.glob(os.path.join(tb.log_dir, "events.out.tfevents.*")) and os.path.exists(csv_logger.metrics_file_path)


def test_without_tensorboard_the_default_logger_is_csv(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a))  # fmt: skip
    trainer = quiet_trainer(tmp_path, logger=True, log_every_n_steps=1)
    assert isinstance(trainer.logger, CSVLogger)
    trainer.fit(TinyModule(), loader(32, 8))
    _, rows = read_csv(os.path.join(tmp_path, "logs", "version_0", "metrics.csv"))
    assert [int(r["step"]) for r in rows if r["train_loss"]] == [0, 1, 2, 3]


def test_csv_adds_a_column_when_a_new_metric_appears_mid_run(tmp_path):
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_metrics({"loss": 0.5}, step=1)
    logger.log_metrics({"loss": 0.25, "val_acc": torch.tensor(0.75)}, step=2)
    logger.log_metrics({"loss": 0.125}, step=3)
    logger.finalize("success")
    columns, rows = read_csv(logger.metrics_file_path)
    assert columns == ["step", "loss", "val_acc"]
    assert [(r["step"], r["loss"], r["val_acc"]) for r in rows] == [
        ("0", "1.0", ""), ("1", "0.5", ""), ("2", "0.25", "0.75"), ("3", "0.125", "")]  # fmt: skip


def test_csv_hparams_yaml_keeps_nesting_and_makes_values_plain(tmp_path):
    logger = CSVLogger(tmp_path)
    logger.log_hyperparams({"lr": 0.1, "optim": {"name": "adam", "betas": (0.9, 0.99)}, "dtype": torch.float16,
                            "scale": torch.tensor(2.0)})  # fmt: skip
    with open(os.path.join(logger.log_dir, "hparams.yaml")) as fh:
        saved = yaml.safe_load(fh)
    assert saved == {"lr": 0.1, "optim": {"name": "adam", "betas": [0.9, 0.99]}, "dtype": "torch.float16", "scale": 2.0}


def test_log_graph_records_the_module_graph(tmp_path):
    module = TinyModule()
    module.example_input_array = torch.zeros(2, 8)
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    quiet_trainer(tmp_path, logger=logger, limit_train_batches=1).fit(module, loader())
    assert read_events(logger.log_dir).Tags()["graph"] is True

    with pytest.warns(UserWarning, match="example_input_array"):
        TensorBoardLogger(tmp_path, name="nograph", log_graph=True).log_graph(TinyModule())


def test_loggers_on_other_ranks_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    for logger in (TensorBoardLogger(tmp_path), CSVLogger(tmp_path, name="csv", flush_logs_every_n_steps=1)):
        logger.log_hyperparams({"lr": 0.1})
        logger.log_metrics({"loss": 1.0}, step=0)
        logger.finalize("success")
        assert logger.log_dir.endswith("version_0")
    assert os.listdir(tmp_path) == []


def test_import_of_loggers_does_not_load_backends():
    heavy = ("tensorboard", "rich", "mlflow", "wandb", "matplotlib", "yaml")
    code = f"import sys, trainer, loggers, callbacks; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"


DDP_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from ui_fixtures import TinyModule, loader
    from trainer.loggers import CSVLogger, TensorBoardLogger
    from trainer import Trainer
    if __name__ == "__main__":
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, log_every_n_steps=1,
                          logger=[TensorBoardLogger({out!r}), CSVLogger({out!r}, name="csv")],
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(TinyModule(), loader(64, 8))
""")


def test_under_two_rank_ddp_only_rank_zero_writes(tmp_path):
    import trainer.strategies as strategies
    if not hasattr(strategies, "DDPStrategy"):
        pytest.skip("strategies.DDPStrategy is not built yet (issue 4); enable this test once DDP is merged")
    out = tmp_path / "runs"
    script = tmp_path / "ddp_run.py"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script.write_text(DDP_SCRIPT.format(root=root, tests=os.path.join(root, "tests"), out=str(out)))
    subprocess.run([sys.executable, str(script)], check=True, timeout=240, cwd=tmp_path)
    assert sorted(os.listdir(out / "logs")) == ["version_0"]
    assert len(glob.glob(str(out / "logs" / "version_0" / "events.out.tfevents.*"))) == 1
    _, rows = read_csv(str(out / "csv" / "version_0" / "metrics.csv"))
    steps = [int(r["step"]) for r in rows if r["train_loss"]]
    assert steps == list(range(4))  # 64 samples / 2 ranks / batch 8: each step logged once, not once per rank


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                    reason="mlflow is not installed: it is heavy (server, SQL, pandas) so it is not a test extra")
def test_mlflow_logger_writes_a_local_file_store(tmp_path):
    from mlflow.tracking import MlflowClient

    logger = loggers.MLflowLogger("exp", tracking_uri=f"file:{tmp_path}/mlruns")
    quiet_trainer(tmp_path, logger=logger, log_every_n_steps=1).fit(TinyModule(), loader(32, 8))
    run = MlflowClient(f"file:{tmp_path}/mlruns").get_run(logger.run_id)
    assert run.data.params["lr"] == "0.1" and "train_loss" in run.data.metrics and run.info.status == "FINISHED"


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                    reason="wandb is not installed: a large package with a service binary, so it is not a test extra")
def test_wandb_logger_runs_offline(tmp_path):
    logger = loggers.WandbLogger(project="p", save_dir=tmp_path, offline=True)
    quiet_trainer(tmp_path, logger=logger, log_every_n_steps=1).fit(TinyModule(), loader(32, 8))
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
