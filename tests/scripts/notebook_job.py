"""A notebook's cell, as a script: ``notebook_launcher`` forks 2 processes whose ``Accelerator()`` joins the job;
``debug_launcher`` does the same on CPU processes. Every process writes ``<name><rank>.pt`` into OUT."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer.accelerate import Accelerator, debug_launcher, notebook_launcher  # noqa: E402


def train(out: Path, name: str) -> None:
    accelerator = Accelerator()
    total = accelerator.reduce(torch.tensor(float(accelerator.process_index + 1)))
    torch.save({"rank": accelerator.process_index, "world": accelerator.num_processes, "sum": float(total),
                "mixed_precision": accelerator.mixed_precision, "device": str(accelerator.device)},
               out / f"{name}{accelerator.process_index}.pt")  # fmt: skip
    accelerator.end_training()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    notebook_launcher(train, args=(out, "notebook"), num_processes=2, mixed_precision="bf16")
    debug_launcher(train, args=(out, "debug"))
