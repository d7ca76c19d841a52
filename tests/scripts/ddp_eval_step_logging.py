"""Two DDP ranks logging on_step=True values with sync_dist in validation_step: each batch's value reaches the
logger (on rank 0) reduced over both ranks, and no rank waits for a collective the other skips."""
import faulthandler
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.loggers import Logger

faulthandler.dump_traceback_later(170, exit=True)  # a hang fails the test with stacks, not a blocked suite
torch.set_num_threads(1)


class Recording(Logger):
    def __init__(self) -> None:
        self.values: list[tuple[int, float]] = []

    def log_metrics(self, metrics, step):
        if "val_rank" in metrics:
            self.values.append((step, metrics["val_rank"]))


class StepLogging(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val_rank", float(self.global_rank), on_step=True, on_epoch=False, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


logger = Recording()
x = torch.arange(16.0).unsqueeze(1)
trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=logger, num_sanity_val_steps=0,
                  enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
trainer.fit(StepLogging(), DataLoader(TensorDataset(x), batch_size=4), DataLoader(TensorDataset(x), batch_size=4))
if trainer.is_global_zero:
    print("RESULT", " ".join(f"{step}:{value}" for step, value in logger.values), flush=True)
sys.exit(0)
