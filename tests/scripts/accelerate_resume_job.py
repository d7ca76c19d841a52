"""A shuffled Accelerate loop saved at an epoch's end, then resumed in fresh objects, written as an Accelerate user
writes it (only the import changed); every rank writes ``rank<r>.pt`` into OUT (tests/test_accelerate_fidelity.py).

    trainer run --devices 2 accelerate_resume_job.py OUT

Two places a script saves at an epoch's end: inside the loop, right after the epoch's last batch
(``checkpointing.py`` with ``--checkpointing_steps`` dividing the epoch), and after the loop (``epoch_<n>``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer.accelerate import Accelerator  # noqa: E402
from trainer.accelerate.utils import set_seed  # noqa: E402

EPOCHS = 3


def run(out: Path, where: str, resume: bool) -> dict:
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.arange(12.0), batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    folder = out / f"checkpoint_{where}"
    first_epoch = 0
    if resume:
        accelerator.load_state(folder)
        first_epoch = 1
    seen = []
    for epoch in range(first_epoch, EPOCHS):
        for step, batch in enumerate(loader):
            seen.append(batch.tolist())
            loss = model(batch[:, None]).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if not resume and epoch == 0 and where == "last_batch" and step == len(loader) - 1:
                accelerator.save_state(folder)
        if not resume and epoch == 0 and where == "after_loop":
            accelerator.save_state(folder)
    return {"batches_per_epoch": len(loader), "seen": seen, "weight": accelerator.unwrap_model(model).weight.detach().clone()}


def main() -> None:
    out = Path(sys.argv[1])
    report = {}
    for where in ("last_batch", "after_loop"):
        report[where] = {"uninterrupted": run(out, where, resume=False), "resumed": run(out, where, resume=True)}
    torch.save(report, out / f"rank{os.environ.get('RANK', '0')}.pt")


if __name__ == "__main__":
    main()
