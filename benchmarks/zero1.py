"""ZeRO-1's optimizer step and state per rank: the row-sliced ``ShardedOptimizer`` (``strategy="zero1"``) against
torch's ``ZeroRedundancyOptimizer`` and plain Adam (what DDP steps), 2 ranks, gloo, one thread per rank.

    python benchmarks/zero1.py                # starts 2 ranks with torchrun and prints the figures
    python benchmarks/zero1.py --rounds 7

Model: the 8-256-256-4 MLP (one matrix holds 95% of the parameters) and a 24 x 256x256 stack. Each round
times ``--steps`` optimizer steps of every side in alternating order (gradients fixed), and the figure is the
median over rounds. Target: every rank holds within ±10% of total/world of the Adam state (1.00x-1.10x of
the mean below). The step times are for reading, not a target: both ZeRO variants add a gather of the updated
parameters to Adam's step; on the CPU the sharded one also pays DTensor's dispatch per op and per parameter
(on CUDA Adam's foreach path dispatches once per op for all parameters).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

MODELS = {"wide": lambda: nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4)),
          "stack": lambda: nn.Sequential(*[nn.Linear(256, 256) for _ in range(24)])}  # fmt: skip


def optimizers(model: nn.Module, mesh) -> dict[str, torch.optim.Optimizer]:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from trainer.strategies.data_parallel.sharded_optimizer import ShardedOptimizer

    return {"adam (ddp)": torch.optim.Adam(model.parameters()),
            "ZeroRedundancyOptimizer": ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam),
            "ShardedOptimizer (zero1)": ShardedOptimizer(torch.optim.Adam(model.parameters()), mesh)}  # fmt: skip


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    local = getattr(optimizer, "optim", optimizer)
    tensors = [v for s in local.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"]
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


def worker(args: argparse.Namespace) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for name, make in MODELS.items():
        torch.manual_seed(0)
        model = make()
        for param in model.parameters():
            param.grad = torch.randn_like(param) * 1e-3
        sides = optimizers(model, mesh)
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_index in range(args.rounds):
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for side in order:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(args.steps):
                    sides[side].step()
                dist.barrier()
                times[side].append((time.perf_counter() - start) / args.steps)
        shares = [None] * dist.get_world_size()
        dist.all_gather_object(shares, {side: state_bytes(opt) for side, opt in sides.items()})
        if dist.get_rank() == 0:
            print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters")
            for side in sides:
                per_rank = [share[side] for share in shares]
                print(f"  {side:26s} {statistics.median(times[side]) * 1e3:8.2f} ms/step   state per rank "
                      f"{per_rank} ({max(per_rank) / (sum(per_rank) / len(per_rank)):.2f}x of the mean)")  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        worker(args)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
               "--steps", str(args.steps), "--rounds", str(args.rounds)]  # fmt: skip
    raise SystemExit(subprocess.call(command, env={**os.environ, "OMP_NUM_THREADS": "1"}))


if __name__ == "__main__":
    main()
