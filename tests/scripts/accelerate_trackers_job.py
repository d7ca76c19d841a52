"""Accelerate's trackers and state on two CPU processes, as a Hugging Face no-trainer script uses them (only the
import changed); every rank writes ``rank<r>.pt`` into OUT.

    python accelerate_trackers_job.py OUT       # Accelerator(cpu=True) with 2 processes started by itself
"""
from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer.accelerate import Accelerator  # noqa: E402
from trainer.accelerate.logging import get_logger  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    faulthandler.dump_traceback_later(100, exit=True)
    from trainer.strategies.data_parallel.ddp import DDPStrategy

    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(out), devices=2,
                              strategy=DDPStrategy(process_group_backend="gloo"))  # fmt: skip
    get_logger("job").info(accelerator.state, main_process_only=False)
    accelerator.init_trackers("run", config={"lr": 0.1, "epochs": 2})
    tracker = accelerator.get_tracker("tensorboard")
    tracker.log({"loss": 1.5 + accelerator.process_index}, step=0)  # a no-op on rank 1
    accelerator.get_tracker("tensorboard", unwrap=True).add_scalar("raw", 2.0, 0)
    accelerator.log({"acc": 0.5}, step=1)
    state = accelerator.state
    report = {
        "trackers": [tracker.name for tracker in accelerator.trackers],
        "name": tracker.name,
        "state": (state.num_processes, state.process_index, state.distributed_type.value, state.mixed_precision,
                  str(state.device)),  # fmt: skip
        "repr": repr(state),
    }
    accelerator.end_training()
    torch.save(report, out / f"rank{accelerator.process_index}.pt")


if __name__ == "__main__":
    main()
