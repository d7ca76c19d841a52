"""Two processes training side by side with gloo collectives; the test sends SIGTERM to one of them.

    python two_rank_signal.py RANK INIT_FILE ROOT READY_FILE

Both must stop at the same optimizer step (they agree through the strategy's collectives), rank 0 writes the
checkpoint, and each prints the step it stopped at before exiting.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from trainer.callbacks import Callback  # noqa: E402
from trainer.strategies import SingleDeviceStrategy  # noqa: E402
from trainer.strategies.rank import rank_zero_only  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402


class GlooCollectives(SingleDeviceStrategy):
    """One CPU process of a two-process job: collectives only (no gradient averaging is needed here)."""

    def __init__(self, rank: int) -> None:
        super().__init__("cpu")
        self.rank = rank

    @property
    def world_size(self) -> int:
        return 2

    @property
    def global_rank(self) -> int:
        return self.rank

    def barrier(self, name=None) -> None:
        dist.barrier()

    def broadcast(self, obj, src: int = 0):
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def reduce(self, tensor, op: str = "mean"):
        tensor = tensor.clone()
        dist.all_reduce(tensor, op={"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(op, dist.ReduceOp.SUM))
        return tensor / 2 if op == "mean" else tensor

    def all_gather(self, tensor):
        out = [torch.empty_like(tensor) for _ in range(2)]
        dist.all_gather(out, tensor)
        return torch.stack(out)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        flag = torch.tensor(int(decision))
        dist.all_reduce(flag, op=dist.ReduceOp.MIN if all else dist.ReduceOp.MAX)
        return bool(flag)


class Slow(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Report(Callback):
    def __init__(self, ready_file: str) -> None:
        self.ready_file = ready_file

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 5 and trainer.global_rank == 1:
            open(self.ready_file, "w").close()

    def on_exception(self, trainer, module, exception):
        print(f"rank {trainer.global_rank} stopped at step {trainer.global_step}", flush=True)


def main() -> None:
    rank, init_file, root, ready_file = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    rank_zero_only.rank = rank
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(0)
    batches = [torch.randn(2, 4) for _ in range(2000)]
    trainer = Trainer(strategy=GlooCollectives(rank), max_epochs=1, default_root_dir=root, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      callbacks=[Report(ready_file)], stop_signals=("SIGTERM",))  # fmt: skip
    trainer._faults.target_seconds = 0.25  # agree more often than the default 2 s: a shorter test
    trainer.fit(Slow(), batches)
    print(f"rank {rank} finished all batches", flush=True)


if __name__ == "__main__":
    main()
