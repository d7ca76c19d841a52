"""The one script every cluster example runs: a tiny regression fit that checkpoints and resumes by itself.

    python examples/clusters/train.py                          # one process here
    trainer run --devices 2 examples/clusters/train.py         # torchrun, 2 processes

Nothing in it names a cluster: the Trainer detects torchrun, SLURM, Ray Train, Kubeflow, SkyPilot or submitit
from the environment (``trainer env`` shows which), and ``fit()`` resumes after a restart or requeue.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule, seed_everything
from trainer.callbacks import ModelCheckpoint


class Regressor(TrainModule):
    """y = x @ w on 4 features: small enough for any CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and fit (``--root-dir``: where logs and checkpoints go; on a cluster, shared storage)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--root-dir", default="runs/clusters")
    parser.add_argument("--max-steps", type=int, default=40)
    args = parser.parse_args(argv)
    seed_everything(0)
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])), batch_size=16, shuffle=True)
    trainer = Trainer(accelerator="cpu", max_steps=args.max_steps, default_root_dir=args.root_dir, logger=False,
                      enable_progress_bar=False, callbacks=[ModelCheckpoint(every_n_train_steps=10, save_top_k=-1)])  # fmt: skip
    trainer.fit(Regressor(), data)
    if trainer.is_global_zero:
        print(f"final train_loss {float(trainer.callback_metrics['train_loss']):.4f} after {trainer.global_step} steps "
              f"on {trainer.world_size} process(es)")  # fmt: skip


if __name__ == "__main__":
    main()
