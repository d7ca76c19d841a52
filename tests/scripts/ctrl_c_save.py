"""A fit that saves a checkpoint after step 1 and a slow one after step 2 (its writing prints SAVING and takes
seconds), for the test that presses Ctrl-C twice during that save.

    python ctrl_c_save.py OUT
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer import Callback, Trainer  # noqa: E402
from trainer.demos import BoringModel  # noqa: E402


class SlowToWrite:
    """Pickled inside the checkpoint write: tells the test the write is under way, then takes its time."""

    def __reduce__(self):
        print("SAVING", flush=True)
        for _ in range(100):  # Python bytecode between sleeps, so a signal handler runs promptly
            time.sleep(0.1)
        return (dict, ())


class SaveEachStep(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            trainer.save_checkpoint(self.out / "step1.ckpt")
        elif trainer.global_step == 2:
            pl_module.slow = True
            trainer.save_checkpoint(self.out / "step2.ckpt")


class Model(BoringModel):
    slow = False

    def on_save_checkpoint(self, checkpoint):
        if self.slow:
            checkpoint["slow"] = SlowToWrite()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    Trainer(accelerator="cpu", max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, callbacks=[SaveEachStep(out)]).fit(Model())  # fmt: skip
