"""``trainer plan`` at full scale: a Llama-3-8B-shaped module (built on ``meta``) at 128 ranks (16 nodes × 8,
dp_shard=16 × tp=8) and at 1024 ranks (128 nodes × 8, dp_shard=128 × tp=8), bf16-mixed, micro-batch 1 × 4096
tokens, FSDP units per block: the wall time of the whole plan and the peak RSS of the process that planned
(each fake rank runs in a forked child; its peak is the largest child's), in one fresh process per size.

    python benchmarks/plan.py                 # both sizes
    python benchmarks/plan.py --ranks 128     # one

Targets (issue 33): 128 ranks in ≤ 60 s and ≤ 2 GB on one core; 1024 ranks in ≤ 3 minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer import TrainModule  # noqa: E402

#: Llama-3-8B's shape.
DIM, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 4096, 32, 32, 8, 14336, 128256


class Block(nn.Module):
    """Grouped-query attention and a SwiGLU MLP, RMSNorm before each (Llama's block)."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)
        self.w1, self.w3 = nn.Linear(DIM, FFN, bias=False), nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(attended.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


class Llama8B(TrainModule):
    """Llama-3-8B's shape; torchtitan's TP plan applied in ``configure_model`` when the mesh has ``tp``."""

    def __init__(self) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.dim, self.vocab_size, self.n_layers = HEADS, KV_HEADS, DIM, VOCAB, LAYERS
        self.tok_embeddings = self.layers = self.norm = self.output = None

    def configure_model(self) -> None:
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)
        mesh = self.device_mesh
        if mesh is not None and "tp" in (mesh.mesh_dim_names or ()) and mesh["tp"].size() > 1:
            from torch.distributed.tensor import Replicate
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            plan = {**{n: ColwiseParallel() for n in ("wq", "wk", "wv", "w1", "w3")},
                    **{n: RowwiseParallel() for n in ("wo", "w2")}}  # fmt: skip
            for block in self.layers.values():
                parallelize_module(block, mesh["tp"], plan)
            parallelize_module(self, mesh["tp"], {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
                                                  "output": ColwiseParallel(output_layouts=Replicate())})  # fmt: skip

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h)
        return self.output(self.norm(h))

    def training_step(self, batch: Any, batch_idx: int = 0) -> torch.Tensor:
        tokens, target = batch
        return nn.functional.cross_entropy(self(tokens).flatten(0, 1).float(), target.flatten())

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=3e-4)


def children_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def one(ranks: int) -> dict[str, Any]:
    """Plan the 8B at ``ranks`` in this process; the figures as a dict."""
    from trainer.plan.hardware import load_profile
    from trainer.plan.job import JobSpec
    from trainer.plan.planner import plan_job

    spec = JobSpec(build=Llama8B, module_name="Llama8B", nodes=ranks // 8, devices_per_node=8, strategy="nd_parallel",
                   tp=8, precision="bf16-mixed", micro_batch_size=1, seq_len=4096, wrap=("Block",))  # fmt: skip
    started = time.perf_counter()
    plan = plan_job(spec, load_profile("h100"))
    seconds = time.perf_counter() - started
    data = plan.as_dict()
    role = data["roles"][0]
    return {"ranks": ranks, "seconds": seconds, "cpu_seconds": time.process_time() + _children_cpu(),
            "planner_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rank_rss": children_peak_bytes(), "param_bytes": role["param_bytes"], "peak_bytes": role["peak_bytes"],
            "step_time_s": data["step_time_s"], "mfu": data["mfu"]}  # fmt: skip


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[128, 1024])
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one(args.child)))
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    print(f"{'ranks':>6} {'wall s':>8} {'cpu s':>8} {'planner RSS':>12} {'rank RSS':>10} {'params/rank':>12} "
          f"{'peak/rank':>10}  step-time bounds (h100)")  # fmt: skip
    for ranks in args.ranks:
        # taskset: one core, as the target says
        done = subprocess.run(["taskset", "-c", "0", sys.executable, __file__, "--child", str(ranks)], env=env,
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            print(done.stderr[-3000:])
            raise SystemExit(done.returncode)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        gib = 2**30
        print(f"{r['ranks']:>6} {r['seconds']:>8.1f} {r['cpu_seconds']:>8.1f} {r['planner_rss'] / gib:>10.2f} G "
              f"{r['rank_rss'] / gib:>8.2f} G {r['param_bytes'] / gib:>10.2f} G {r['peak_bytes'] / gib:>8.2f} G  "
              f"{r['step_time_s']['lower']:.2f}-{r['step_time_s']['upper']:.2f} s, MFU "
              f"{r['mfu']['worst'] * 100:.0f}-{r['mfu']['best'] * 100:.0f}%")  # fmt: skip


if __name__ == "__main__":
    main()
