"""Small classifier/regressor modules of Lightning's test helpers, re-made on the public API."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Accuracy, MeanSquaredError

from trainer import TrainModule


class ClassificationModel(TrainModule):
    """Three Linear+ReLU blocks and a 3-way output passed through softmax; Adam at ``lr``.

    Logs ``{train,val,test}_loss`` (cross entropy of the softmax output) and ``{train,val,test}_acc``.
    """

    def __init__(self, num_features: int = 32, num_classes: int = 3, lr: float = 0.01) -> None:
        super().__init__()
        self.lr = lr
        for i in range(3):
            setattr(self, f"layer_{i}", nn.Linear(num_features, num_features))
            setattr(self, f"layer_{i}a", nn.ReLU())
        self.layer_end = nn.Linear(num_features, 3)
        accuracy = Accuracy(task="multiclass", num_classes=num_classes)
        self.train_acc, self.valid_acc, self.test_acc = accuracy.clone(), accuracy.clone(), accuracy.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(3):
            x = getattr(self, f"layer_{i}a")(getattr(self, f"layer_{i}")(x))
        return F.softmax(self.layer_end(x), dim=1)

    def configure_optimizers(self) -> Any:
        return [torch.optim.Adam(self.parameters(), lr=self.lr)], []

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        probs = self(x)
        loss = F.cross_entropy(probs, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc(probs, y), prog_bar=True)
        return {"loss": loss}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        probs = self(x)
        self.log("val_loss", F.cross_entropy(probs, y), prog_bar=False)
        self.log("val_acc", self.valid_acc(probs, y), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        probs = self(x)
        self.log("test_loss", F.cross_entropy(probs, y), prog_bar=False)
        self.log("test_acc", self.test_acc(probs, y), prog_bar=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])


class RegressionModel(TrainModule):
    """Linear(16, 64), two Linear(64, 64), each with ReLU, then Linear(64, 1); MSE loss, Adam(0.01)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_0, self.layer_0a = nn.Linear(16, 64), nn.ReLU()
        self.layer_1, self.layer_1a = nn.Linear(64, 64), nn.ReLU()
        self.layer_2, self.layer_2a = nn.Linear(64, 64), nn.ReLU()
        self.layer_end = nn.Linear(64, 1)
        self.train_mse, self.valid_mse, self.test_mse = MeanSquaredError(), MeanSquaredError(), MeanSquaredError()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(3):
            x = getattr(self, f"layer_{i}a")(getattr(self, f"layer_{i}")(x))
        return self.layer_end(x)

    def configure_optimizers(self) -> Any:
        return [torch.optim.Adam(self.parameters(), lr=0.01)], []

    def _log_stage(self, stage: str, metric: MeanSquaredError, batch: Any) -> torch.Tensor:
        x, y = batch
        out = self(x)
        loss = F.mse_loss(out, y)
        self.log(f"{stage}_loss", loss, prog_bar=False)
        self.log(f"{stage}_MSE", metric(out, y), prog_bar=True)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"loss": self._log_stage("train", self.train_mse, batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._log_stage("val", self.valid_mse, batch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._log_stage("test", self.test_mse, batch)
