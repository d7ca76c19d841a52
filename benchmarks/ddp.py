"""Per-step cost of the Trainer's DDP against a hand-written DDP loop (2 ranks, gloo, one thread per rank).

    python benchmarks/ddp.py                 # starts 2 ranks with torchrun and prints the ratio
    python benchmarks/ddp.py --rounds 7      # more alternating rounds for a steadier median
    python benchmarks/ddp.py --model tiny --steps 200   # little compute: the Trainer's own cost shows

Model 512-1024-1024-10 MLP, batch 256 per rank, SGD. Both sides run in the same two processes, in
alternating rounds (so machine load hits both alike); each round times steps ``--warmup``..``--steps``, and
the figure is the median over rounds of Trainer/hand-written (adjacent runs see the same load). Target: <= 1.02.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

BATCH = 256


WIDTHS = {"medium": (512, 1024, 1024, 10), "tiny": (512, 8, 8, 10)}
WIDTH = WIDTHS["medium"]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    a, b, c, d = WIDTH
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c), nn.ReLU(), nn.Linear(c, d))


def make_data(steps: int, world: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    n = steps * BATCH * world
    return TensorDataset(torch.randn(n, 512, generator=generator), torch.randint(0, 10, (n,), generator=generator))


def hand_written(data: TensorDataset, steps: int, warmup: int) -> float:
    """The loop a user would write with torch.distributed directly; returns seconds per step."""
    model = nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
    dist.barrier()
    start = 0.0
    for step, (x, y) in enumerate(loader):
        if step == warmup:
            start = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / (steps - warmup)


def with_trainer(data: TensorDataset, steps: int, warmup: int) -> float:
    """The same training through Trainer(strategy="ddp") joining the torchrun job; returns seconds per step."""
    from trainer.callbacks import Callback
    from trainer import Trainer, TrainModule

    class MLP(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(Callback):
        start = end = 0.0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == warmup:
                self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.end = time.perf_counter()

    clock = Clock()
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False, callbacks=[clock],
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(MLP(), DataLoader(data, batch_size=BATCH))
    return (clock.end - clock.start) / (steps - warmup)


def worker(args: argparse.Namespace) -> None:
    global WIDTH
    WIDTH = WIDTHS[args.model]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # the Trainer joins this group instead of creating one
    world = dist.get_world_size()
    data = make_data(args.steps, world)
    hand, framework = [], []
    for round_index in range(args.rounds):
        # Alternate which side goes first so a drift in machine load does not favour either.
        if round_index % 2:
            framework.append(with_trainer(data, args.steps, args.warmup))
            hand.append(hand_written(data, args.steps, args.warmup))
        else:
            hand.append(hand_written(data, args.steps, args.warmup))
            framework.append(with_trainer(data, args.steps, args.warmup))
    if dist.get_rank() == 0:
        h, t = statistics.median(hand), statistics.median(framework)
        paired = statistics.median(f / b for f, b in zip(framework, hand))
        print(f"hand-written DDP : {h * 1e3:8.2f} ms/step  (rounds: {', '.join(f'{v * 1e3:.1f}' for v in hand)})")
        print(f"Trainer ddp      : {t * 1e3:8.2f} ms/step  (rounds: {', '.join(f'{v * 1e3:.1f}' for v in framework)})")
        print(f"ratio Trainer / hand-written: {paired:.3f}x median of per-round ratios, {t / h:.3f}x of medians "
              "(target <= 1.02x)")
        print(f"difference: {(t - h) * 1e6:+.0f} us/step")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=25, help="steps per round and side")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of each round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", choices=sorted(WIDTHS), default="medium",
                        help="'tiny' makes compute negligible, so the difference is the Trainer's own per-step cost")
    args = parser.parse_args()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        worker(args)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--rounds", str(args.rounds),
               "--model", args.model]  # fmt: skip
    raise SystemExit(subprocess.call(command, env={**os.environ, "OMP_NUM_THREADS": "1"}))


if __name__ == "__main__":
    main()
