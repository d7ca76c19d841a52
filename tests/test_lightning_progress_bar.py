"""Progress bars as a Lightning project customises them: ``get_metrics`` (with ``v_num``) decides what is shown,
and a ``ProgressBar`` subclass of one's own replaces the default bar and reads the ``total_*`` members."""
from __future__ import annotations

import io

import torch
from rich.console import Console
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar
from trainer.loggers import CSVLogger


def data(n: int = 12) -> DataLoader:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class Regressor(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_default_metrics_carry_the_logger_version(tmp_path):
    bar = RichProgressBar(console=Console(file=io.StringIO()))
    trainer = Trainer(accelerator="cpu", max_epochs=1, callbacks=[bar], logger=CSVLogger(tmp_path, version=7),
                      enable_checkpointing=False)  # fmt: skip
    trainer.fit(Regressor(), data(), data())
    shown = bar.get_metrics(trainer, trainer.lightning_module)
    assert shown["v_num"] == 7 and set(shown) == {"v_num", "train_loss", "val_loss"}
    assert "v_num=7" in bar.console.file.getvalue()
    named = CSVLogger(tmp_path, version="experiment_abcd1234")
    assert RichProgressBar().get_metrics(Trainer(accelerator="cpu", logger=named), None) == {"v_num": "1234"}
    assert RichProgressBar().get_metrics(Trainer(accelerator="cpu", logger=False), None) == {}


class NoVersionBar(TQDMProgressBar):
    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        items["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
        return items


def test_overridden_get_metrics_is_what_the_bar_prints(tmp_path):
    bar = NoVersionBar()
    bar.console = Console(file=io.StringIO())
    trainer = Trainer(accelerator="cpu", max_epochs=1, callbacks=[bar], logger=CSVLogger(tmp_path),
                      enable_checkpointing=False)  # fmt: skip
    trainer.fit(Regressor(), data(), data())
    printed = bar.console.file.getvalue()
    assert "lr=0.01" in printed and "train_loss=" in printed
    assert "v_num" not in printed


class PercentBar(ProgressBar):
    """A bar of one's own, as in Lightning's docs: prints the share of the epoch done."""

    def __init__(self):
        super().__init__()
        self.enabled = True
        self.lines = []

    def disable(self):
        self.enabled = False

    def enable(self):
        self.enabled = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.lines.append(f"{100 * (batch_idx + 1) / self.total_train_batches:.0f}% {self.train_description}")

    def on_validation_epoch_end(self, trainer, pl_module):
        self.lines.append(f"{self.validation_description} of {self.total_val_batches}")


def test_own_progress_bar_replaces_the_default(tmp_path):
    bar = PercentBar()
    trainer = Trainer(accelerator="cpu", max_epochs=1, callbacks=[bar], logger=False, enable_checkpointing=False,
                      num_sanity_val_steps=0, limit_val_batches=2)  # fmt: skip
    assert trainer.progress_bar_callback is bar
    assert not any(isinstance(cb, RichProgressBar) for cb in trainer.callbacks)
    trainer.fit(Regressor(), data(), data())
    assert bar.trainer is trainer
    assert bar.lines == ["33% Training", "67% Training", "100% Training", "Validation of 2"]


def test_total_val_batches_is_zero_in_epochs_that_do_not_validate(tmp_path):
    seen = []

    class Records(Regressor):
        def on_train_epoch_end(self):
            seen.append(self.trainer.progress_bar_callback.total_val_batches)

    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, max_epochs=4, check_val_every_n_epoch=2,
                      limit_val_batches=2, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                      enable_model_summary=False)  # fmt: skip
    trainer.fit(Records(), data(), data())
    assert seen == [0, 2, 0, 2]  # a bar sizing itself for validation sees none in epochs 0 and 2
