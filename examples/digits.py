"""Train a small MLP on scikit-learn's handwritten digits (8x8 images, no download) and print the
final validation accuracy.

    python examples/digits.py                              # one CPU process
    python examples/digits.py --devices 2 --strategy ddp   # two processes, gloo
    python examples/digits.py --precision bf16-mixed       # autocast to bfloat16
"""
from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Trainer, TrainModule, seed_everything


class DigitsData(DataModule):
    """The 1797 digits, split 80/20 into train/validation with a fixed seed."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32) / 16.0
        y = torch.tensor(y, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        split = int(0.8 * len(x))
        self.train_set = TensorDataset(x[order[:split]], y[order[:split]])
        self.val_set = TensorDataset(x[order[split:]], y[order[split:]])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class DigitsClassifier(TrainModule):
    """64 → 128 → 128 → 10 MLP with dropout."""

    def __init__(self, hidden: int = 128, lr: float = 2e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), prog_bar=True, sync_dist=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="1")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--root-dir", default="runs/digits")
    args = parser.parse_args()

    seed_everything(42)
    torch.set_num_threads(1)
    trainer = Trainer(
        accelerator=args.accelerator, devices=args.devices, strategy=args.strategy, precision=args.precision,
        max_epochs=args.max_epochs, default_root_dir=args.root_dir, log_every_n_steps=10,
    )  # fmt: skip
    module = DigitsClassifier()
    trainer.fit(module, datamodule=DigitsData(args.batch_size))
    accuracy = float(trainer.callback_metrics["val_acc"])
    if trainer.is_global_zero:
        print(f"final validation accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
