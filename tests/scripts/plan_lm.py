"""A tiny decoder-only LM for the ``trainer plan`` tests: its sizes are attributes (``n_heads``, ``n_layers``,
``vocab_size``, ``dim``) as a real model's config has them, its blocks are built in ``configure_model`` with the
tensor-parallel plan applied there when the mesh has a ``tp`` dimension (torchtitan's way).

    python -m trainer plan tests/scripts/plan_lm.py:make_module --world-size 4 --strategy nd_parallel --tp 2 \
        --micro-batch-size 2 --seq-len 16

Run under torchrun (``--out DIR --specs fsdp,zero2,...``) it is the real side of tests/test_plan.py: each rank sets
each job up with the same strategy code, steps once on real tensors and writes what it measured (the same
measurements the plan makes on fake ones) to ``DIR/<spec>-rank<r>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer import TrainModule  # noqa: E402


class Block(nn.Module):
    """Pre-norm attention and MLP; the head count follows the local width, so a tensor-parallel part has its share."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(torch.relu(self.up(self.norm2(x))))


class PlanLM(TrainModule):
    """Embedding, ``n_layers`` blocks, norm, output head; AdamW."""

    def __init__(self, vocab_size: int = 64, dim: int = 32, n_heads: int = 4, n_layers: int = 2) -> None:
        super().__init__()
        self.vocab_size, self.dim, self.n_heads, self.n_layers = vocab_size, dim, n_heads, n_layers
        self.embed = self.layers = self.norm = self.head = None

    def configure_model(self) -> None:
        if self.layers is not None:
            return
        self.embed = nn.Embedding(self.vocab_size, self.dim)
        self.layers = nn.ModuleDict({str(i): Block(self.dim, self.n_heads) for i in range(self.n_layers)})
        self.norm, self.head = nn.LayerNorm(self.dim), nn.Linear(self.dim, self.vocab_size, bias=False)
        mesh = self.device_mesh
        if mesh is not None and "tp" in (mesh.mesh_dim_names or ()) and mesh["tp"].size() > 1:
            apply_tensor_parallel(self, mesh["tp"])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) if self.embed is not None else tokens  # a later pipeline stage gets activations
        for block in self.layers.values():
            h = block(h)
        return self.head(self.norm(h)) if self.head is not None else h

    def pipeline_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    def training_step(self, batch: Any, batch_idx: int = 0) -> torch.Tensor:
        tokens, target = batch
        return self.pipeline_loss(self(tokens), target)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def apply_tensor_parallel(module: PlanLM, tp_mesh: Any) -> None:
    """Megatron's split: q, k, v and up column-wise, o and down row-wise; embedding row-wise, head column-wise."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {**{n: ColwiseParallel() for n in ("q", "k", "v", "up")}, **{n: RowwiseParallel() for n in ("o", "down")}}
    for block in module.layers.values():
        parallelize_module(block, tp_mesh, plan)
    parallelize_module(module, tp_mesh, {"embed": RowwiseParallel(input_layouts=Replicate()),
                                         "head": ColwiseParallel(output_layouts=Replicate())})  # fmt: skip


def make_module() -> PlanLM:
    """The default sizes (what the tests plan)."""
    return PlanLM()


#: The jobs the tests hold to reality: name -> (strategy, tp, pp).
SPECS = {"fsdp": ("fsdp", 1, 1), "zero2": ("zero2", 1, 1), "nd_tp": ("nd_parallel", 2, 1), "pp": ("nd_parallel", 1, 2)}
MICRO_BATCH, SEQ_LEN = 2, 16


def job(name: str, world: int) -> Any:
    """The :class:`~trainer.plan.job.JobSpec` of test job ``name`` on one node of ``world`` devices."""
    from trainer.plan.job import JobSpec

    strategy, tp, pp = SPECS[name]
    return JobSpec(build=make_module, module_name="plan_lm.py:make_module", devices_per_node=world, strategy=strategy,
                   tp=tp, pp=pp, micro_batch_size=MICRO_BATCH, seq_len=SEQ_LEN)  # fmt: skip


def measured(spec: Any) -> dict[str, Any]:
    """This rank's real set-up of ``spec`` (the strategy's code on the gloo process group), one real step, and the
    same measurements the plan makes."""
    from trainer.loops.optimizers import parse_optimizers
    from trainer.module.train_module import configure_model_once
    from trainer.plan.fake_rank import _Host, make_strategy
    from trainer.plan.job import make_batch
    from trainer.plan.measure import held_bytes, measure_step

    cpu = torch.device("cpu")
    strategy = make_strategy(spec)
    strategy.connect([cpu] * spec.devices_per_node, spec.nodes, None)
    strategy.setup_environment()
    module = spec.build()
    module._trainer = _Host(strategy)
    module.__dict__["_log_warned"] = True
    configure_model_once(module, strategy)
    strategy.setup_module(module)
    optimizers, _ = parse_optimizers(module.configure_optimizers(), module.automatic_optimization)
    optimizers = strategy.setup_optimizers(optimizers)
    batch = make_batch(spec, module, cpu)
    if getattr(strategy, "_pipeline", None) is not None:  # the schedule's step as the Trainer runs it; the plan compares bytes here
        strategy.backward(strategy.training_step(batch, 0))
        for optimizer in optimizers:
            strategy.optimizer_step(optimizer, lambda: None)
        return held_bytes(module, optimizers)
    step = measure_step(strategy, module, optimizers, batch)
    return {**held_bytes(module, optimizers), "peak_bytes": step.peak_bytes, "peak_holders": step.peak_holders,
            "collectives": [c.as_dict() for c in step.collectives]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--specs", default=",".join(SPECS))
    args = parser.parse_args()
    import torch.distributed as dist

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    for name in args.specs.split(","):
        result = measured(job(name, world))
        Path(args.out, f"{name}-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":
    main()
