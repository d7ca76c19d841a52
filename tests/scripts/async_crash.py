"""A fit whose process dies (``os._exit(9)``) inside the background checkpoint writer, half-way through writing
the step-3 checkpoint: fault injection into ``torch.save`` in the writer thread only.

    python async_crash.py ROOT
"""
from __future__ import annotations

import os
import sys
import threading

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/ for ckpt_support
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from ckpt_support import TinyRegressor, loaders, make_trainer  # noqa: E402

from trainer.callbacks import ModelCheckpoint  # noqa: E402

real_save = torch.save


def crashing_save(obj, f, *args, **kwargs):
    if threading.current_thread().name == "trainer-checkpoint-writer" and obj.get("global_step") == 3:
        f.write(b"PK\x03\x04" + b"\x00" * 1000)  # the start of a checkpoint, then the process is gone
        f.flush()
        os._exit(9)
    return real_save(obj, f, *args, **kwargs)


def main() -> None:
    root = sys.argv[1]
    torch.save = crashing_save
    callback = ModelCheckpoint(dirpath=os.path.join(root, "checkpoints"), every_n_train_steps=1, save_last=True,
                               save_top_k=1, asynchronous=True)  # fmt: skip
    make_trainer(root, max_epochs=1, callbacks=[callback]).fit(TinyRegressor(), *loaders())


if __name__ == "__main__":
    main()
