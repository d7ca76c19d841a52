"""What a user watches: progress bar (terminal and CI logs), model summary and end-of-fit report (issue 8)."""
from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console
from torch import nn
from ui_fixtures import TinyModule, loader, quiet_trainer

from trainer.callbacks import Callback, FitReport, ModelCheckpoint, ModelSummary, RichProgressBar, ThroughputMonitor
from trainer.callbacks.model_summary import summarize
from trainer import Trainer


@pytest.fixture(autouse=True)
def no_forced_terminal(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)


def test_default_progress_in_a_captured_run_is_plain_lines_with_the_metrics(tmp_path, capsys):
    trainer = quiet_trainer(tmp_path, enable_progress_bar=True, max_epochs=2)
    trainer.fit(TinyModule(), loader(64, 8), loader(16, 8))
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out  # no cursor movement or colour codes in a log file
    epoch_lines = [line for line in out.splitlines() if " done " in line]
    assert [line.split(" done")[0] for line in epoch_lines] == ["Epoch 1/2", "Epoch 2/2"]
    assert all("train_loss=" in line and "val_loss=" in line and "8 batches" in line for line in epoch_lines)
    assert "Validation  2 batches  val_loss=" in out


def test_plain_lines_repeat_at_the_line_interval(tmp_path):
    buffer = io.StringIO()
    bar = RichProgressBar(line_interval=0.0, console=Console(file=buffer, width=200))
    quiet_trainer(tmp_path, callbacks=[bar]).fit(TinyModule(), loader(64, 8))
    periodic = [line for line in buffer.getvalue().splitlines() if line.startswith("Epoch 1/1 step")]
    assert len(periodic) == 8  # interval 0: one line per batch
    assert periodic[-1].split("  ")[1] == "8/8" and "it/s" in periodic[-1] and "train_loss=" in periodic[-1]


def test_on_a_terminal_bars_render(tmp_path):
    buffer = io.StringIO()
    bar = RichProgressBar(refresh_interval=0.0, console=Console(file=buffer, force_terminal=True, width=160))
    quiet_trainer(tmp_path, callbacks=[bar], max_epochs=2).fit(TinyModule(), loader(64, 8), loader(16, 8))
    out = buffer.getvalue()
    assert "━" in out and "it/s" in out and "8/8" in out
    assert "Epochs" in out and "2/2" in out and "train_loss=" in out
    assert "Epoch 2/2 done" in out


def test_metrics_are_read_only_when_the_bar_redraws(tmp_path, monkeypatch):
    reads = []
    original = Trainer.progress_bar_metrics

    def counting(self):
        reads.append(self.global_step)
        return original.fget(self)

    monkeypatch.setattr(Trainer, "progress_bar_metrics", property(counting))
    for console in (Console(file=io.StringIO()), Console(file=io.StringIO(), force_terminal=True)):
        reads.clear()
        bar = RichProgressBar(refresh_interval=60.0, line_interval=60.0, console=console)
        quiet_trainer(tmp_path, callbacks=[bar]).fit(TinyModule(), loader(256, 4), loader(8, 4))  # 64 steps
        assert len(reads) == 3  # validation start and end, epoch end: not per step


def test_validate_test_and_predict_show_their_progress(tmp_path):
    buffer = io.StringIO()
    trainer = quiet_trainer(tmp_path, callbacks=[RichProgressBar(console=Console(file=buffer, width=200))])
    module = TinyModule()
    trainer.validate(module, loader(24, 8), verbose=False)
    trainer.test(module, loader(16, 8), verbose=False)
    trainer.predict(module, [list(torch.zeros(5, 8).split(2))])
    out = buffer.getvalue()
    assert out.splitlines() == [line for line in out.splitlines() if line]  # one line per event, nothing else
    assert "Validation  3 batches  val_loss=" in out
    assert "Test  2 batches" in out
    assert "Predict  3 batches" in out


def test_nothing_is_drawn_off_rank_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(Trainer, "is_global_zero", property(lambda self: False))
    buffer = io.StringIO()
    console = Console(file=buffer)
    callbacks = [RichProgressBar(line_interval=0.0, console=console), ModelSummary(console=console),
                 FitReport(console=console)]  # fmt: skip
    quiet_trainer(tmp_path, callbacks=callbacks).fit(TinyModule(), loader(16, 8))
    assert buffer.getvalue() == ""


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(10, 20)
        self.decoder = nn.Linear(20, 10)
        self.tied = self.encoder  # the same parameters under a second name
        self.norm = nn.BatchNorm1d(20)
        self.decoder.requires_grad_(False)


def test_model_summary_counts_shared_parameters_once_and_frozen_ones_apart():
    summary = summarize(Shared())
    rows = {row.name: row for row in summary.rows}
    assert set(rows) == {"encoder", "decoder", "norm"}  # a module registered twice is listed once
    assert (rows["encoder"].params, rows["encoder"].trainable, rows["encoder"].kind) == (220, 220, "Linear")
    assert (rows["decoder"].params, rows["decoder"].trainable) == (210, 0)
    assert (summary.total, summary.trainable, summary.non_trainable) == (470, 260, 210)
    # parameters + BatchNorm's running mean and var (float32) and num_batches_tracked (int64)
    assert summary.size_mb == pytest.approx((470 * 4 + 40 * 4 + 8) / 2**20)


def test_model_summary_table_is_printed_at_fit_start(tmp_path):
    buffer = io.StringIO()
    trainer = quiet_trainer(tmp_path, callbacks=[ModelSummary(console=Console(file=buffer, width=120))],
                            limit_train_batches=1)  # fmt: skip
    trainer.fit(TinyModule(hidden=100), loader())
    out = buffer.getvalue()
    assert "TinyModule summary" in out and "net" in out and "Sequential" in out
    assert "1.1 K  Trainable params" in out and "1.1 K  Total params" in out and "Estimated model size (MB)" in out


class StandInCheckpoint(Callback):
    """What the report reads from a ModelCheckpoint (issue 6 builds the real one)."""

    best_model_path = "/runs/best-epoch=1.ckpt"
    best_model_score = torch.tensor(0.125)
    monitor = "val_loss"


def test_fit_report_lists_time_steps_throughput_memory_best_checkpoint_and_skipped_steps(tmp_path):
    buffer = io.StringIO()
    report = FitReport(console=Console(file=buffer, width=160))
    trainer = quiet_trainer(tmp_path, callbacks=[report, ThroughputMonitor(), StandInCheckpoint()], max_epochs=2)
    trainer.fit(TinyModule(), loader(64, 8))
    rows = dict(report.rows)
    assert rows["Epochs / steps"] == "2 epochs, 16 optimizer steps"
    assert rows["Throughput"].endswith("batches/s") and float(rows["Throughput"].split()[0].replace(",", "")) > 0
    assert rows["Data wait"].endswith("% of training time")
    assert "peak RSS" in rows["Peak memory"]
    assert rows["Best checkpoint"] == "/runs/best-epoch=1.ckpt (val_loss=0.125)"
    assert rows["Skipped fp16 steps"] == "0"
    assert "Fit report" in buffer.getvalue() and "val_loss=0.125" in buffer.getvalue()


def test_fit_report_of_a_resumed_fit_counts_only_this_runs_steps_and_keeps_paths_whole(tmp_path):
    first = quiet_trainer(tmp_path, max_epochs=2)
    first.fit(TinyModule(), loader(64, 8))
    path = tmp_path / "a-checkpoint-with-a-rather-long-name-so-that-it-does-not-fit-in-forty-columns.ckpt"
    first.save_checkpoint(path)
    buffer = io.StringIO()
    report = FitReport(console=Console(file=buffer, width=40))  # a log file, not a terminal
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor=None)
    resumed = quiet_trainer(tmp_path, callbacks=[report, checkpoint], enable_checkpointing=True, max_epochs=3)
    resumed.fit(TinyModule(), loader(64, 8), ckpt_path=path)
    rows = dict(report.rows)
    assert rows["Epochs / steps"] == "3 epochs, 24 optimizer steps (8 in this run, resumed at step 16)"
    steps_per_second = float(rows["Throughput"].split()[0].replace(",", ""))
    assert 0 < steps_per_second < 1e5  # 8 steps over this run's time, not 24
    best = rows["Best checkpoint"]
    assert best.endswith("epoch=2-step=24.ckpt") and best in buffer.getvalue(), (best, buffer.getvalue())  # unbroken


def test_defaults_are_added_once_and_user_instances_replace_them(tmp_path):
    mine = RichProgressBar(refresh_interval=1.0)
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[mine], logger=False)
    kinds = [type(cb).__name__ for cb in trainer.callbacks]
    assert kinds.count("RichProgressBar") == 1 and mine in trainer.callbacks
    assert "ModelSummary" in kinds and "FitReport" in kinds
    bare = Trainer(accelerator="cpu", default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False)
    assert not any(isinstance(cb, (RichProgressBar, ModelSummary, FitReport)) for cb in bare.callbacks)
