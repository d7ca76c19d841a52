"""Two DDP ranks requesting their loaders as Lightning does (issue 25), while a callback reads
``trainer.train_dataloader`` on rank 0 only before training (that read must not be a collective, or rank 0 would
wait forever for rank 1). Each rank prints one RESULT line: what it requested, when, and what it ran."""
import faulthandler
import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.callbacks import Callback

faulthandler.dump_traceback_later(170, exit=True)  # a hang fails the test with stacks, not a blocked suite
torch.set_num_threads(1)


class Model(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.calls: list = []
        self.val_batches = 0

    def train_dataloader(self):
        self.calls.append(["train_dataloader", self.current_epoch])
        return DataLoader(TensorDataset(torch.arange(16.0).unsqueeze(1)), batch_size=2, shuffle=True)

    def val_dataloader(self):
        self.calls.append(["val_dataloader", self.current_epoch, self.trainer.sanity_checking])
        return DataLoader(TensorDataset(torch.arange(8.0).unsqueeze(1)), batch_size=2)

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1
        self.log("val", batch[0].mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RankZeroReader(Callback):
    def on_fit_start(self, trainer, module):
        if trainer.is_global_zero:
            module.calls.append(["read", len(trainer.train_dataloader)])

    def on_train_start(self, trainer, module):
        module.calls.append(["on_train_start", trainer.num_training_batches])


model = Model()
trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, enable_progress_bar=False,
                  enable_checkpointing=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
                  callbacks=[RankZeroReader()])
trainer.fit(model)
result = {"rank": trainer.global_rank, "calls": model.calls, "val_batches": model.val_batches,
          "state": [str(trainer.state.fn), str(trainer.state.status)]}
sys.stdout.write(f"RESULT {json.dumps(result)}\n")  # one write: the two ranks share the pipe, lines stay whole
sys.stdout.flush()
sys.exit(0)
