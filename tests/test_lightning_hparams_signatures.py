"""``save_hyperparameters(Namespace(...))`` as argparse-era Lightning projects call it, and callback signatures
with real types (tools build argument parsers from ``inspect.signature``)."""
from __future__ import annotations

import argparse
import inspect
import os
from typing import Optional, Union

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint


class ArgparseModel(TrainModule):
    def __init__(self, hparams: argparse.Namespace) -> None:
        super().__init__()
        self.save_hyperparameters(hparams)
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def test_save_hyperparameters_takes_an_argparse_namespace(tmp_path):
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--layers", type=int, default=2)
    model = ArgparseModel(parser.parse_args([]))
    assert dict(model.hparams) == {"lr": 0.1, "layers": 2} and model.hparams.layers == 2
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2))
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    assert torch.load(tmp_path / "a.ckpt", weights_only=True)["hyper_parameters"] == {"lr": 0.1, "layers": 2}


def test_callback_signatures_give_types_not_strings():
    parameters = inspect.signature(ModelCheckpoint).parameters
    assert parameters["dirpath"].annotation == Optional[Union[str, os.PathLike]]
    assert parameters["save_top_k"].annotation is int and parameters["monitor"].annotation == Optional[str]
    assert inspect.signature(EarlyStopping).parameters["patience"].annotation is int
    assert inspect.signature(LearningRateMonitor).parameters["logging_interval"].annotation == Optional[str]

    parser = argparse.ArgumentParser()  # what an argparse-based CLI builder does with them
    for name, parameter in parameters.items():
        if parameter.annotation in (int, float, bool, str):
            parser.add_argument(f"--{name}", type=parameter.annotation, default=parameter.default)
    assert parser.parse_args(["--save_top_k", "3"]).save_top_k == 3
