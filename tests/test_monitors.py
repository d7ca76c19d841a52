"""Monitors report plausible values; the data-loading advice appears when loading is slow, and only then;
accumulation scheduling and the Timer change the run as configured (issue 8)."""
from __future__ import annotations

import csv
import os
import time
import warnings
from datetime import timedelta

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from ui_fixtures import SlowDataset, TinyModule, blobs, loader, quiet_trainer

from trainer.callbacks import (
    Callback,
    GradientAccumulationScheduler,
    LearningRateMonitor,
    MemoryMonitor,
    ThroughputMonitor,
    Timer,
)
from trainer.callbacks.timer import parse_duration
from trainer.loggers import CSVLogger
from trainer.strategies.errors import ConfigurationError
from trainer import TrainModule


def csv_rows(logger: CSVLogger) -> list[dict[str, str]]:
    with open(logger.metrics_file_path, newline="") as fh:
        return list(csv.DictReader(fh))


def column(rows: list[dict[str, str]], name: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[name])) for r in rows if r.get(name)]


def test_lr_monitor_logs_the_rate_each_logged_step_used(tmp_path):
    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(tmp_path, logger=logger, log_every_n_steps=2,
                            callbacks=[LearningRateMonitor(log_momentum=True)])  # fmt: skip
    trainer.fit(TinyModule(lr=0.1, scheduler="step"), loader(64, 8))  # StepLR: halves every 2 steps
    rows = csv_rows(logger)
    assert column(rows, "lr-SGD") == [(s, pytest.approx(0.1 * 0.5 ** (s // 2))) for s in (1, 3, 5, 7)]
    assert [v for _, v in column(rows, "lr-SGD-momentum")] == pytest.approx([0.9] * 4)
    assert trainer.callback_metrics["lr-SGD"] == pytest.approx(0.1 * 0.5**3)


def test_lr_monitor_per_epoch_and_per_param_group(tmp_path):
    class TwoGroups(TinyModule):
        def configure_optimizers(self):
            first, second = self.net[0], self.net[2]
            groups = [{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.01}]
            return torch.optim.Adam(groups, lr=0.1)

    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(tmp_path, logger=logger, max_epochs=2, callbacks=[LearningRateMonitor("epoch")])
    trainer.fit(TwoGroups(), loader())
    rows = csv_rows(logger)
    assert column(rows, "lr-Adam/pg1") == [(7, pytest.approx(0.1)), (15, pytest.approx(0.1))]
    assert column(rows, "lr-Adam/pg2") == [(7, pytest.approx(0.01)), (15, pytest.approx(0.01))]


def test_memory_monitor_logs_plausible_rss_and_prints_the_peak(tmp_path, capsys):
    logger = CSVLogger(tmp_path)
    monitor = MemoryMonitor()
    quiet_trainer(tmp_path, logger=logger, log_every_n_steps=2, callbacks=[monitor]).fit(TinyModule(), loader())
    rows = csv_rows(logger)
    rss, peak = column(rows, "memory/rss_mb"), column(rows, "memory/peak_rss_mb")
    assert [s for s, _ in rss] == [1, 3, 5, 7]
    assert all(20 < v < 64_000 for _, v in rss)  # a python process with torch loaded, below any sane machine
    assert all(p >= r for (_, r), (_, p) in zip(rss, peak))
    assert "Memory: peak RSS" in capsys.readouterr().out


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: the CUDA figures need one")
def test_memory_monitor_reads_the_cuda_allocator(tmp_path):
    monitor = MemoryMonitor(verbose=False)
    quiet_trainer(tmp_path, accelerator="cuda", callbacks=[monitor]).fit(TinyModule(), loader())
    peaks = monitor.peaks
    assert 0 < peaks["memory/cuda_max_allocated_mb"] <= peaks["memory/cuda_reserved_mb"]


def test_throughput_monitor_counts_samples_and_excludes_validation_time(tmp_path):
    logger = CSVLogger(tmp_path)
    monitor = ThroughputMonitor()
    started = time.perf_counter()
    quiet_trainer(tmp_path, logger=logger, log_every_n_steps=4, callbacks=[monitor]).fit(
        TinyModule(), loader(60, 8), DataLoader(SlowDataset(8, 0.05), batch_size=4))  # 8 batches (last has 4)
    wall = time.perf_counter() - started
    summary = monitor.summary
    assert (summary["batches"], summary["samples"]) == (8, 60)
    assert summary["samples_per_sec"] == pytest.approx(60 / 8 * summary["batches_per_sec"])
    assert 0 <= summary["data_wait_share"] <= 1
    assert summary["train_time_s"] < wall - 0.3  # the 0.4 s of validation is not training time
    rows = csv_rows(logger)
    assert [s for s, _ in column(rows, "throughput/samples_per_sec")] == [3, 7]
    assert all(0 <= v <= 1 for _, v in column(rows, "throughput/data_wait"))


def test_a_slow_dataset_gets_one_warning_with_concrete_advice(tmp_path):
    monitor = ThroughputMonitor(min_batches=4)
    with pytest.warns(UserWarning, match="Data loading is the bottleneck") as record:
        quiet_trainer(tmp_path, callbacks=[monitor], log_every_n_steps=2, max_epochs=2).fit(
            TinyModule(), DataLoader(SlowDataset(24, 0.003), batch_size=4))  # fmt: skip
    advice = [str(w.message) for w in record if "bottleneck" in str(w.message)]
    assert len(advice) == 1
    assert "num_workers=" in advice[0] and "persistent_workers=True" in advice[0] and "ms per batch" in advice[0]
    assert monitor.summary["data_wait_share"] > 0.5


class Wide(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_fast_in_memory_dataset_gets_no_advice(tmp_path):
    monitor = ThroughputMonitor()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer = quiet_trainer(tmp_path, callbacks=[monitor], log_every_n_steps=10)
        trainer.fit(Wide(), DataLoader(blobs(64 * 40), batch_size=64))
    assert not monitor.warned and monitor.summary["data_wait_share"] < 0.5


class CountSteps(Callback):
    def __init__(self) -> None:
        self.per_epoch: list[int] = []
        self._start = 0

    def on_train_epoch_start(self, trainer, module):
        self._start = trainer.global_step

    def on_train_epoch_end(self, trainer, module):
        self.per_epoch.append(trainer.global_step - self._start)


def test_gradient_accumulation_follows_the_schedule(tmp_path):
    counter = CountSteps()
    scheduler = GradientAccumulationScheduler({1: 2, 2: 4})
    quiet_trainer(tmp_path, max_epochs=3, callbacks=[scheduler, counter]).fit(TinyModule(), loader(64, 8))
    assert counter.per_epoch == [8, 4, 2]
    with pytest.raises(ConfigurationError, match="accumulate_grad_batches=2"):
        quiet_trainer(tmp_path, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({1: 4})]).fit(
            TinyModule(), loader())  # fmt: skip
    for bad in ({}, {-1: 2}, {0: 0}, {"1": 2}):
        with pytest.raises(ConfigurationError):
            GradientAccumulationScheduler(bad)


class SlowSteps(TinyModule):
    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


class StandInCheckpoint(Callback):
    def __init__(self, dirpath):
        self.dirpath = dirpath
        self.best_model_path = ""


def test_timer_stops_saves_a_checkpoint_and_the_budget_spans_a_resume(tmp_path, capsys):
    timer = Timer(duration=0.15)
    trainer = quiet_trainer(tmp_path, max_epochs=50, callbacks=[timer], logger=CSVLogger(tmp_path))
    trainer.fit(SlowSteps(), loader(64, 8))
    stopped_at = trainer.global_step
    assert 3 <= stopped_at < 50 * 8
    assert "Timer: time is up" in capsys.readouterr().out
    path = timer.checkpoint_path
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["global_step"] == stopped_at
    assert path == os.path.join(tmp_path, "logs", "version_0", "checkpoints",
                                f"timer-epoch={checkpoint['epoch']}-step={stopped_at}.ckpt")  # fmt: skip
    assert checkpoint["callbacks"]["Timer"]["time_elapsed"]["train"] >= 0.15
    assert timer.end_time("train") - timer.start_time("train") == pytest.approx(timer.time_elapsed("train"))
    assert timer.start_time("test") is None and timer.end_time("test") is None

    resumed = Timer(duration=0.15)
    again = quiet_trainer(tmp_path, max_epochs=50, callbacks=[resumed])
    again.fit(SlowSteps(), loader(64, 8), ckpt_path=path)
    assert stopped_at <= again.global_step <= stopped_at + 1  # the saved time already spent the budget


def test_timer_saves_into_the_checkpoint_callbacks_folder(tmp_path):
    timer = Timer(duration=timedelta(seconds=0.05), interval="epoch", verbose=False)
    folder = tmp_path / "ckpts"
    trainer = quiet_trainer(tmp_path, max_epochs=50, callbacks=[timer, StandInCheckpoint(str(folder))])
    trainer.fit(SlowSteps(), loader(32, 8))
    assert trainer.current_epoch < 50 and trainer.global_step % 4 == 0  # stopped at an epoch end
    assert os.listdir(folder) == [os.path.basename(timer.checkpoint_path)]


def test_timer_durations():
    assert parse_duration("01:02:03:04") == 93784
    assert parse_duration(dict(hours=1, minutes=30)) == 5400
    assert parse_duration(timedelta(minutes=2)) == 120 and parse_duration(90) == 90.0
    assert parse_duration(timedelta(0)) == 0.0  # as in Lightning: stops before the first step
    for bad in ("1:2:3", "soon", -5, {"hourz": 1}):
        with pytest.raises(ConfigurationError):
            parse_duration(bad)
    with pytest.raises(ConfigurationError):
        Timer(duration=10, interval="batch")
