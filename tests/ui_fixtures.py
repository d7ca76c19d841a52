"""Tiny models and data shared by the callback and logger tests (issue 8)."""
from __future__ import annotations

import time
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainer import Trainer, TrainModule

torch.set_num_threads(1)


def blobs(n: int = 64, features: int = 8, seed: int = 0) -> TensorDataset:
    """A learnable 2-class problem."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def loader(n: int = 64, batch_size: int = 8, **kwargs: Any) -> DataLoader:
    return DataLoader(blobs(n), batch_size=batch_size, **kwargs)


class TinyModule(TrainModule):
    """Logs ``train_loss`` (progress bar) every step and ``val_loss``/``val_acc`` per validation epoch."""

    def __init__(self, lr: float = 0.1, hidden: int = 16, scheduler: Optional[str] = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        if self.hparams.scheduler == "step":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2, 0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        return optimizer


class SlowDataset(Dataset):
    """Each sample costs ``delay`` seconds to load: data loading becomes the bottleneck."""

    def __init__(self, n: int, delay: float) -> None:
        self.data = blobs(n)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.delay)
        return self.data[index]


def quiet_trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    """A CPU trainer with no default UI, checkpointing or logger unless asked for."""
    options: dict[str, Any] = dict(accelerator="cpu", devices=1, default_root_dir=tmp_path, logger=False,
                                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                   num_sanity_val_steps=0, max_epochs=1)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)
