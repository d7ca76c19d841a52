"""One of two fits started at once on the same default_root_dir (argv: root, go-file, lr, steps-file).

Waits until the go-file exists (so both runs resolve their version folder and save their first checkpoints at
the same moment), fits with the default logger and a checkpoint every step, and prints its log folder."""
import os
import sys
import time

import torch

from trainer import Trainer
from trainer.callbacks import ModelCheckpoint

sys.path.insert(0, __file__.rsplit("/", 2)[0])  # tests/ (ckpt_support)
from ckpt_support import TinyRegressor, loaders  # noqa: E402

root, go, lr = sys.argv[1], sys.argv[2], float(sys.argv[3])
torch.manual_seed(0)
module = TinyRegressor(lr=lr)
trainer = Trainer(default_root_dir=root, max_epochs=3, accelerator="cpu", devices=1, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1,
                  callbacks=[ModelCheckpoint(every_n_train_steps=1, save_top_k=-1, save_last=True)])
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
trainer.fit(module, *loaders())
print(f"LOG_DIR={trainer.log_dir}", flush=True)
