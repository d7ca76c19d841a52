"""Launched by the launch/SLURM tests: a tiny regression fit whose Trainer gets devices/num_nodes from the launcher.

``python train.py OUT [--steps N] [--pause S] [--ready-at K] [--user-handler]`` trains, and global rank 0 writes the final
weights to ``OUT/weights-<SLURM_RESTART_COUNT or 0>.pt``. Without ``--steps`` the Trainer's ``max_steps``
must come from the launcher (config file or ``--trainer.max_steps``). ``--user-handler`` installs a SIGUSR1
handler of the script's own that touches ``OUT/user-handler-<rank>`` (the Trainer must chain it). ``--pause`` sleeps after every step (so a test can
signal mid-training); ``--ready-at K`` makes rank 0 touch ``OUT/ready`` after step K of the first run.
"""
import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for helpers
from helpers import Regressor, regression_data  # noqa: E402

from trainer import Trainer  # noqa: E402


class Paced(Regressor):
    def __init__(self, pause: float = 0.0, ready_at: int = -1, out: str = ".") -> None:
        super().__init__()
        self.pause, self.ready_at, self.out = pause, ready_at, out

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.pause:
            time.sleep(self.pause)
        first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
        if self.global_step == self.ready_at and first_run and self.global_rank == 0:
            Path(self.out, "ready").touch()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--ready-at", type=int, default=-1)
    parser.add_argument("--user-handler", action="store_true")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    if args.user_handler:
        rank = os.environ.get("SLURM_PROCID", "0")
        signal.signal(signal.SIGUSR1, lambda *_: Path(args.out, f"user-handler-{rank}").touch())
    torch.manual_seed(0)
    model = Paced(args.pause, args.ready_at, args.out)
    data = DataLoader(regression_data(n=64), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=args.out)  # fmt: skip
    if args.steps is not None:
        options["max_steps"] = args.steps
    trainer = Trainer(**options)
    trainer.fit(model, data)
    if trainer.is_global_zero:
        restart = os.environ.get("SLURM_RESTART_COUNT", "0")
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save({"state_dict": state, "world_size": trainer.world_size, "global_step": trainer.global_step},
                   Path(args.out) / f"weights-{restart}.pt")  # fmt: skip


if __name__ == "__main__":
    main()
