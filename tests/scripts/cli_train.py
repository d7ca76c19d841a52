"""A script driven by ``TrainerCLI`` as Lightning scripts are by ``LightningCLI``:

    python cli_train.py fit --config config.yaml --model.lr=0.05
    python cli_train.py test --config config.yaml --ckpt_path=best
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer import DataModule, TrainerCLI, TrainModule  # noqa: E402


class Regression(TrainModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1, activation: str = "tanh") -> None:
        super().__init__()
        self.save_hyperparameters()
        act = nn.Tanh() if activation == "tanh" else nn.ReLU()
        self.net = nn.Sequential(nn.Linear(4, hidden), act, nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Wider(Regression):
    """For ``subclass_mode_model``: picked by ``--model=...Wider``."""

    def __init__(self, hidden: int = 32, lr: float = 0.1) -> None:
        super().__init__(hidden, lr)


class Data(DataModule):
    def __init__(self, batch_size: int = 8, samples: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(samples, 4, generator=generator)
        self.data = TensorDataset(x, x.sum(1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


if __name__ == "__main__":
    TrainerCLI(Regression, Data)
