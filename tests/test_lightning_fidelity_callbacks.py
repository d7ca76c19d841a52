"""Lightning 2.6's observable callback and tuner behaviour, written as a Lightning user writes them (second
measurement of Lightning's own public-API tests): the Timer with a spent budget, the batch-size search on a CPU
without a memory budget, the hyperparameters it updates, and the module paths a ported import names."""
from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import DataModule, Trainer, TrainModule
from trainer.callbacks import Timer
from trainer.tuner import Tuner
from ui_fixtures import blobs


class Net(TrainModule):
    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.layer(x), y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(64), batch_size=self.batch_size)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def quiet(tmp_path: Any, **kwargs: Any) -> Trainer:
    kwargs.setdefault("max_epochs", 1)
    return Trainer(default_root_dir=tmp_path, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, **kwargs)  # fmt: skip


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_a_timer_with_no_time_left_stops_before_the_first_step(tmp_path, interval):
    trainer = quiet(tmp_path, max_epochs=3, callbacks=[Timer(duration=timedelta(0), interval=interval)])
    trainer.fit(Net())
    assert (trainer.global_step, trainer.current_epoch) == (0, 0)


def test_a_spent_timer_still_trains_min_steps(tmp_path):
    timer = Timer(duration=timedelta(0))
    trainer = quiet(tmp_path, max_epochs=3, min_steps=3, callbacks=[timer])
    trainer.fit(Net())
    assert trainer.global_step >= 3 and timer.time_elapsed() > 0


def test_scale_batch_size_on_cpu_without_a_budget_doubles_up_to_the_dataset(tmp_path):
    model = Net()
    size = Tuner(quiet(tmp_path)).scale_batch_size(model, mode="power", steps_per_trial=1, max_trials=4)
    assert size == model.batch_size == 16  # 2, 4, 8, 16: four trials, none can run out of memory here
    assert Tuner(quiet(tmp_path)).scale_batch_size(Net(), mode="power", steps_per_trial=1) == 64  # the dataset


def test_scale_batch_size_sets_a_datamodules_hyperparameter(tmp_path):
    class Data(DataModule):
        def __init__(self, batch_size: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self) -> DataLoader:
            return DataLoader(blobs(64), batch_size=self.hparams.batch_size)

    data = Data()
    Tuner(quiet(tmp_path)).scale_batch_size(Net(), datamodule=data, mode="power", steps_per_trial=1, max_trials=3)
    assert data.hparams.batch_size == 8


def test_scale_batch_size_warns_when_the_size_is_both_an_attribute_and_a_hyperparameter(tmp_path):
    class Both(Net):
        def __init__(self, batch_size: int = 2) -> None:
            super().__init__(batch_size)
            self.save_hyperparameters()

    with pytest.warns(UserWarning, match="are mutually exclusive"):
        Tuner(quiet(tmp_path)).scale_batch_size(Both(), mode="power", steps_per_trial=1, max_trials=2)


@pytest.mark.parametrize(
    ("path", "name"),
    [("trainer.core.module", "TrainModule"), ("trainer.core.module", "LightningModule"),
     ("trainer.core.datamodule", "DataModule"), ("trainer.core.datamodule", "LightningDataModule"),
     ("trainer.core", "TrainModule"), ("trainer.core", "DataModule"),
     ("trainer.loggers.tensorboard", "TensorBoardLogger"), ("trainer.loggers.csv_logs", "CSVLogger")],
)  # fmt: skip
def test_lightnings_module_paths_after_the_rename_import(path, name):
    # `from lightning.pytorch.core.module import LightningModule` becomes, after the documented rename,
    # `from trainer.core.module import TrainModule`: both spellings import, and are our classes.
    import trainer
    from trainer.loggers import CSVLogger, TensorBoardLogger

    ours = {"TrainModule": trainer.TrainModule, "LightningModule": trainer.TrainModule,
            "DataModule": trainer.DataModule, "LightningDataModule": trainer.DataModule,
            "TensorBoardLogger": TensorBoardLogger, "CSVLogger": CSVLogger}  # fmt: skip
    assert getattr(importlib.import_module(path), name) is ours[name]


def test_simple_profiler_writes_each_stages_summary_to_its_file(tmp_path):
    from trainer.profiler import SimpleProfiler

    profiler = SimpleProfiler(filename="perf")  # dirpath: the Trainer's log_dir, as in Lightning
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=2, profiler=profiler, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    trainer.fit(Net())
    assert profiler.dirpath == trainer.log_dir == str(tmp_path)
    assert "training_step" in (tmp_path / "fit-perf.txt").read_text()

    short = SimpleProfiler(dirpath=tmp_path / "new", filename="perf", extended=False)
    quiet(tmp_path, limit_train_batches=2, profiler=short).fit(Net())
    text = (tmp_path / "new" / "fit-perf.txt").read_text()
    assert "mean" in text and "percent" not in text and "calls" not in text


def test_simple_profiler_refuses_unbalanced_actions_with_a_value_error():
    from trainer.profiler import SimpleProfiler

    profiler = SimpleProfiler()
    with pytest.raises(ValueError, match="never started"):
        profiler.stop("load")
    profiler.start("load")
    with pytest.raises(ValueError, match="already started"):
        profiler.start("load")
    profiler.stop("load")
    assert len(profiler.recorded_durations["load"]) == 1


def test_profiler_names_are_case_insensitive(tmp_path):
    from trainer.profiler import SimpleProfiler

    assert isinstance(Trainer(default_root_dir=tmp_path, profiler="Simple").profiler, SimpleProfiler)


def test_a_profiler_used_on_its_own_describes_what_it_recorded(tmp_path, capsys):
    from trainer.profiler import SimpleProfiler

    profiler = SimpleProfiler(dirpath=tmp_path, filename="alone")
    with profiler.profile("load"):
        pass
    profiler.describe()
    assert "load" in capsys.readouterr().out and "load" in (tmp_path / "alone.txt").read_text()


def test_lr_find_takes_weights_only(tmp_path):
    class WithLr(Net):
        def __init__(self) -> None:
            super().__init__()
            self.lr = 0.1

    result = Tuner(quiet(tmp_path)).lr_find(WithLr(), num_training=5, weights_only=True)
    assert result is not None and len(result.results["lr"]) > 0


def test_lr_find_with_too_few_steps_for_a_suggestion_leaves_the_rate_alone(tmp_path):
    class WithLr(Net):
        def __init__(self) -> None:
            super().__init__()
            self.learning_rate = 0.123

    model = WithLr()
    result = Tuner(quiet(tmp_path)).lr_find(model, update_attr=True, num_training=1)
    assert result.suggestion() is None and model.learning_rate == 0.123


def test_lr_find_on_a_module_without_a_rate_attribute_is_an_attribute_error(tmp_path):
    with pytest.raises(AttributeError, match="learning_rate"):
        Tuner(quiet(tmp_path)).lr_find(Net(), update_attr=True)


def test_scale_batch_size_sets_the_size_on_the_module_and_the_datamodule(tmp_path):
    class Data(DataModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2

        def train_dataloader(self) -> DataLoader:
            return DataLoader(blobs(64), batch_size=self.batch_size)

    model, data = Net(batch_size=2), Data()
    trainer = quiet(tmp_path)
    size = Tuner(trainer).scale_batch_size(model, datamodule=data, mode="binsearch", init_val=4, max_trials=2)
    assert size == model.batch_size == data.batch_size == 7  # 4 and 8 fit; Lightning's 5% margin below 8


def test_lr_monitor_logs_zero_momentum_and_warns_for_an_optimizer_without_one(tmp_path):
    from trainer.callbacks import LearningRateMonitor
    from trainer.loggers import CSVLogger

    class Plain(Net):
        def configure_optimizers(self) -> Any:
            return torch.optim.ASGD(self.parameters(), lr=1e-2)

    monitor = LearningRateMonitor(log_momentum=True)
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=3, log_every_n_steps=1,
                      callbacks=[monitor], logger=CSVLogger(tmp_path), enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    with pytest.warns(RuntimeWarning, match="optimizers do not have momentum"):
        trainer.fit(Plain())
    assert monitor.last_momentum_values == {"lr-ASGD-momentum": 0.0}


def test_lr_monitor_logs_every_n_batches_with_two_manual_optimizers(tmp_path):
    from trainer.callbacks import LearningRateMonitor
    from trainer.loggers import CSVLogger

    class Two(Net):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            for optimizer in self.optimizers():  # two optimizer steps per batch: global_step grows by 2
                loss = super().training_step(batch, batch_idx)
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()

        def configure_optimizers(self) -> Any:
            return [torch.optim.Adam(self.parameters(), lr=1e-2), torch.optim.Adam(self.parameters(), lr=1e-2)]

    monitor = LearningRateMonitor(logging_interval="step")
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=8, log_every_n_steps=2,
                      callbacks=[monitor], logger=CSVLogger(tmp_path), enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    trainer.fit(Two())
    assert trainer.global_step == 16
    assert {name: len(values) for name, values in monitor.lrs.items()} == {"lr-Adam": 4, "lr-Adam-1": 4}
