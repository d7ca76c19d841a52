"""A fit whose loss turns NaN at micro-batch 5 on every rank (argv[1]: root folder, argv[2]: devices).

Rank 0 catches the NonFiniteLossError, checks the weights in memory against the named checkpoint, prints what it
saw, and re-raises: the process must end non-zero, as under ``trainer run``. (An error leaving fit() on rank 0
stops the ranks it launched, so only rank 0 gets to print.)"""
import math
import sys

import torch

from trainer import NonFiniteLossError, Trainer
from trainer.callbacks import ModelCheckpoint

sys.path.insert(0, __file__.rsplit("/", 2)[0])  # tests/ (ckpt_support)
from ckpt_support import TinyRegressor, loaders  # noqa: E402


class LossTurnsNaN(TinyRegressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.trainer.fit_loop.progress.total_batches == 5 else loss


root, devices = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
module = LossTurnsNaN()
trainer = Trainer(default_root_dir=root, max_epochs=4, devices=devices, accelerator="cpu", logger=False,
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                  callbacks=[ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1)])
train, val = loaders(samples=32)
try:
    trainer.fit(module, train, val)
except NonFiniteLossError as err:
    saved = torch.load(err.checkpoint_path, weights_only=True)["state_dict"]
    same = all(torch.equal(saved[name], value) for name, value in module.state_dict().items())
    print(f"rank {trainer.global_rank}: caught at step {err.global_step}, weights as saved: {same}, "
          f"interrupted: {trainer.interrupted}", flush=True)
    raise
