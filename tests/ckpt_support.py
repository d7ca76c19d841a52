"""Small models, data and Trainer settings shared by the checkpointing tests."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule

torch.set_num_threads(1)

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False)


class TinyRegressor(TrainModule):
    """Linear → ReLU → Dropout → Linear on 6 features; logs ``train_loss`` and ``val_loss``.

    ``val_scores`` (optional) replaces the logged ``val_loss`` with a scripted value per epoch (the last one
    repeats), so a resumed fit logs what the uninterrupted one would.
    """

    def __init__(self, hidden: int = 8, lr: float = 0.01, val_scores: Optional[list[float]] = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        scores = self.hparams.val_scores
        if scores is not None and not self.trainer.sanity_checking:
            loss = torch.tensor(scores[min(self.current_epoch, len(scores) - 1)])
        self.log("val_loss", loss)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


def loaders(samples: int = 16, batch_size: int = 4, shuffle: bool = True) -> tuple[DataLoader, DataLoader]:
    """A training loader (``samples // batch_size`` batches) and a 2-batch validation loader, fixed data."""
    generator = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(samples, 6, generator=generator), torch.randn(samples, 1, generator=generator))
    val = TensorDataset(torch.randn(8, 6, generator=generator), torch.randn(8, 1, generator=generator))
    return DataLoader(train, batch_size=batch_size, shuffle=shuffle), DataLoader(val, batch_size=4)


def make_trainer(root: Any, **kwargs: Any) -> Trainer:
    """A quiet CPU Trainer writing under ``root``."""
    settings = dict(QUIET, default_root_dir=str(root), max_epochs=2, num_sanity_val_steps=0)
    settings.update(kwargs)
    return Trainer(**settings)


def uninterrupted(root: Any, max_epochs: int) -> TinyRegressor:
    """The reference a resumed fit must match: ``TinyRegressor`` (seed 0) trained ``max_epochs`` on :func:`loaders`
    without stopping; the caller seeds 0 again before building the module it interrupts."""
    torch.manual_seed(0)
    reference = TinyRegressor()
    make_trainer(root, max_epochs=max_epochs).fit(reference, *loaders())
    return reference


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Bitwise equality of every parameter and buffer."""
    left, right = a.state_dict(), b.state_dict()
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)
