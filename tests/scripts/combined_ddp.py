"""Combined training loaders under DDP: one fit per CombinedLoader mode on 2 CPU ranks (gloo), unshuffled
loaders of 40 and 24 samples, batch 2 per rank; every rank writes ``rank<r>.pt`` into OUT with each fit's
weights, step count and the sample ids it trained on, so a test can compare them with one process and batch 4.

    python combined_ddp.py OUT
"""
from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer import CombinedLoader, Trainer, TrainModule  # noqa: E402

MODES = ("max_size_cycle", "min_size", "max_size", "sequential")
HANG_DUMP_S = 100


def dataset(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True), torch.arange(n))


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.seen: list[dict] = []

    def training_step(self, batch):
        parts = batch if isinstance(batch, dict) else {"one": batch}
        self.seen.append({key: None if part is None else part[2].tolist() for key, part in parts.items()})
        return sum(nn.functional.mse_loss(self.net(x), y) for x, y, _ in (p for p in parts.values() if p is not None))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(mode: str, devices: int, batch: int) -> tuple[Trainer, Net]:
    torch.manual_seed(0)
    module = Net()
    loaders = {"a": DataLoader(dataset(40, 1), batch_size=batch), "b": DataLoader(dataset(24, 2), batch_size=batch)}
    train = loaders if mode == "max_size_cycle" else CombinedLoader(loaders, mode)  # a plain dict: max_size_cycle
    distributed = {"strategy": "ddp"} if devices > 1 else {}
    trainer = Trainer(accelerator="cpu", devices=devices, max_epochs=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **distributed)  # fmt: skip
    trainer.fit(module, train)
    return trainer, module


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)  # a hang fails with a traceback
    report: dict = {}
    for mode in MODES:
        trainer, module = fit(mode, devices=2, batch=2)
        report[mode] = {"weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
                        "global_step": trainer.global_step, "seen": module.seen}  # fmt: skip
        report["rank"] = trainer.global_rank
    torch.save(report, out / f"rank{report['rank']}.pt")


if __name__ == "__main__":
    main()
