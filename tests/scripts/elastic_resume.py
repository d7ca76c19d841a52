"""Launched by ``trainer run --devices 2 --max-restarts 1``: rank 1 kills itself (SIGKILL) at step 17 of the
first attempt; the elastic agent restarts both workers, whose ``fit()`` resumes by itself from the newest
checkpoint (saved every 5 steps). The final attempt then trains the same fit uninterrupted in another folder.

    python elastic_resume.py OUT     (rank 0 writes OUT/resumed.pt and OUT/reference.pt)
"""
import os
import signal
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for helpers
from helpers import Regressor, regression_data  # noqa: E402

from trainer.callbacks import ModelCheckpoint  # noqa: E402
from trainer import Trainer  # noqa: E402

STEPS, KILL_AT, EVERY = 20, 17, 5
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


class DiesOnce(Regressor):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if FIRST_ATTEMPT and self.global_rank == 1 and self.global_step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)


def fit(root: Path) -> dict:
    torch.manual_seed(0)
    model = DiesOnce()
    data = DataLoader(regression_data(n=64), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    checkpoints = ModelCheckpoint(dirpath=root / "checkpoints", every_n_train_steps=EVERY, save_top_k=-1)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                      callbacks=[checkpoints])  # fmt: skip
    trainer.fit(model, data)  # no ckpt_path: a restarted job resumes by itself
    return {"state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "global_step": trainer.global_step, "resumed_from": trainer.ckpt_path}  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    resumed = fit(out / "run")
    os.environ.pop("TORCHELASTIC_RESTART_COUNT")  # the reference is a first run: it must not resume
    reference = fit(out / "reference")
    if int(os.environ["RANK"]) == 0:
        torch.save(resumed, out / "resumed.pt")
        torch.save(reference, out / "reference.pt")


if __name__ == "__main__":
    main()
