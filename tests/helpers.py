"""Small models and data shared by the tests."""
from __future__ import annotations

import contextlib
import os
import signal
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.callbacks import Callback


def regression_data(n: int = 64, features: int = 4, seed: int = 0) -> TensorDataset:
    """A fixed linear-regression dataset."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = x @ torch.arange(1.0, features + 1).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def loader(n: int = 64, batch_size: int = 8, features: int = 4, seed: int = 0, **kwargs: Any) -> DataLoader:
    return DataLoader(regression_data(n, features, seed), batch_size=batch_size, **kwargs)


class Regressor(TrainModule):
    """A 4-8-1 MLP trained with MSE; logs train_loss per step and val_loss per epoch."""

    def __init__(self, features: int = 4, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def quiet_trainer(**kwargs: Any) -> Trainer:
    """A Trainer without progress bar, summary, logger or checkpointing unless asked."""
    options = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False,
                   accelerator="cpu", devices=1)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)


class Crash(Callback):
    """Raises ``RuntimeError("simulated crash")`` as the fit reaches its ``after_batches``-th batch (counted over the
    whole fit): a run that stops mid-epoch, for the resume tests."""

    def __init__(self, after_batches: int) -> None:
        self.after_batches = after_batches

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.fit_loop.progress.total_batches == self.after_batches:
            raise RuntimeError("simulated crash")


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")
                     if hasattr(signal, name))


@contextlib.contextmanager
def restored_process_state(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Puts back this process's environment and the handlers of ``signals`` as they were on entry (a run in the
    pytest process, or a library such as Ray, may change both and leave them for every later test)."""
    environment = dict(os.environ)
    handlers = {signum: signal.getsignal(signum) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
        if os.environ != environment:
            os.environ.clear()
            os.environ.update(environment)
