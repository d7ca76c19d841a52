"""Two DDP ranks logging with sync_dist while a callback reads the metrics on rank 0 only (a read must never
be a collective, or rank 0 would wait forever for rank 1). Prints the reduced epoch values from rank 0."""
import faulthandler
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.callbacks import Callback
from trainer import Trainer, TrainModule

faulthandler.dump_traceback_later(170, exit=True)  # a hang fails the test with stacks, not a blocked suite
torch.set_num_threads(1)


class LogsEverywhere(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        self.log("rank_value", float(self.global_rank), sync_dist=True, on_step=True, on_epoch=True, prog_bar=True)
        self.log("x_mean", x.mean(), sync_dist=True, on_epoch=True)
        return self.lin(x).sum()

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_x", x.mean(), sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class RankZeroReader(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            dict(trainer.callback_metrics)
            dict(trainer.progress_bar_metrics)

    def on_validation_end(self, trainer, module):
        if trainer.is_global_zero:
            dict(trainer.callback_metrics)


x = torch.arange(16.0).unsqueeze(1)
trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, log_every_n_steps=2, logger=False,
                  callbacks=[RankZeroReader()], enable_checkpointing=False, enable_model_summary=False)
trainer.fit(LogsEverywhere(), DataLoader(TensorDataset(x), batch_size=2), DataLoader(TensorDataset(x), batch_size=4))
if trainer.is_global_zero:
    metrics = trainer.callback_metrics
    print("RESULT", float(metrics["rank_value_epoch"]), float(metrics["x_mean"]), float(metrics["val_x"]), flush=True)
sys.exit(0)
