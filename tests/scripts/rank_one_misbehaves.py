"""At micro-batch 3, training_step returns None on rank 1 only (argv[2] == "one") or on every rank ("all"), or
rank 1 is killed with SIGKILL ("kill"). argv[1]: the root folder."""
import os
import signal
import sys

import torch

from trainer import Trainer
from trainer.strategies import DDPStrategy

sys.path.insert(0, __file__.rsplit("/", 2)[0])  # tests/ (ckpt_support)
from ckpt_support import TinyRegressor, loaders  # noqa: E402


class Skips(TinyRegressor):
    def __init__(self, ranks) -> None:
        super().__init__()
        self.ranks = ranks

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.global_rank in self.ranks and self.trainer.fit_loop.progress.total_batches == 3:
            if sys.argv[2] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            return None
        return loss


torch.manual_seed(0)
trainer = Trainer(default_root_dir=sys.argv[1], max_epochs=1, devices=2, accelerator="cpu", logger=False,
                  strategy=DDPStrategy(train_timeout=30), enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(Skips((0, 1) if sys.argv[2] == "all" else (1,)), loaders(samples=64)[0])
print(f"rank {trainer.global_rank} finished at global step {trainer.global_step}", flush=True)
