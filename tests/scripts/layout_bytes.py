"""For tests/test_memory_layouts.py: build N-D layouts with torch's own APIs on 4 gloo processes and record,
per rank, the bytes of the local tensors it really allocated next to what the memory planner predicts.

    python -m torch.distributed.run --standalone --nproc-per-node=4 layout_bytes.py --out DIR

Each layout is made directly with ``init_device_mesh``, ``parallelize_module`` (the planner's built-in
"megatron" plan), ``fully_shard`` and ``torch.distributed.pipelining`` (a stage per pipeline rank, built by
deleting the other stages' modules as torchtitan does, run with ``ScheduleGPipe``); then one Adam step runs, so
gradients and optimizer state exist. Every rank writes ``rank<r>.pt``: ``{layout name: {"measured": ...,
"planned": ...}}`` with parameters, gradients and optimizer state in bytes, and under ``"zero1"`` ZeRO-1's
sharded optimizer checked against plain AdamW.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_train import allocated_bytes  # noqa: E402
from trainer.strategies.checkpoint.sharded_checkpoint import is_dtensor  # noqa: E402
from trainer.strategies.nd.tp_plan import megatron_plan  # noqa: E402
from trainer.strategies.nd.mesh import MeshLayout  # noqa: E402
from trainer.memory.planner import estimate_layout  # noqa: E402

VOCAB, WIDTH, HEADS, CONTEXT, BLOCKS = 50, 16, 4, 8, 3  # vocab 50: uneven over 4 (13, 13, 13, 11) and FSDP-padded
BATCH, MICROBATCHES = 4, 2
BOUNDARIES = ["transformer.h.2"]  # pipeline stage 1 begins at the last block
LAYOUTS = [MeshLayout(dp_shard=4), MeshLayout(dp_replicate=2, dp_shard=2), MeshLayout(dp_shard=2, tp=2), MeshLayout(tp=4),
           MeshLayout(dp_shard=2, pp=2), MeshLayout(tp=2, pp=2)]  # fmt: skip
HANG_DUMP_S = 120


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        q, k, v = (m(x).view(batch, time, -1, WIDTH // HEADS).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # local heads under tensor parallelism
        return self.proj(y.transpose(1, 2).reshape(batch, time, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """nanoGPT's structure (the head tied to the token embedding); blocks in a ModuleDict, so a pipeline stage
    that deletes the others keeps their names, and a stage without some top-level module skips it."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, WIDTH), wpe=nn.Embedding(CONTEXT, WIDTH),
            h=nn.ModuleDict({str(i): Block() for i in range(BLOCKS)}), ln_f=nn.LayerNorm(WIDTH)))  # fmt: skip
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        if "wte" in t:
            x = t["wte"](x) + t["wpe"](torch.arange(x.shape[1]))
        for block in t["h"].values():
            x = block(x)
        if "ln_f" in t:
            x = t["ln_f"](x)
        return self.lm_head(x) if self.lm_head is not None else x


def keep_stage(model: TinyGPT, stage: int) -> TinyGPT:
    """Delete what the other pipeline stage runs (stage 0: embeddings, blocks 0-1; stage 1: block 2, norm, head)."""
    t = model.transformer
    if stage == 0:
        del t["h"]["2"], t["ln_f"]
        model.lm_head = None
    else:
        del t["h"]["0"], t["h"]["1"], t["wte"], t["wpe"]
    return model


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor.parallel import loss_parallel

    if is_dtensor(logits):  # vocab-sharded logits of the tensor-parallel head
        with loss_parallel():
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build_and_step(layout: MeshLayout, rank: int) -> dict[str, int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    dims = [(name, getattr(layout, name)) for name in ("pp", "dp_replicate", "dp_shard", "tp") if getattr(layout, name) > 1]
    mesh = init_device_mesh("cpu", tuple(size for _, size in dims), mesh_dim_names=tuple(name for name, _ in dims))
    torch.manual_seed(0)
    model = TinyGPT()
    plan = megatron_plan(model, {Block})  # of the whole model: a stage lacks the head the plan is derived from
    stage = mesh["pp"].get_local_rank() if layout.pp > 1 else 0
    if layout.pp > 1:
        model = keep_stage(model, stage)
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())  # the pipeline's loss takes plain logits
    if layout.tp > 1:
        with warnings.catch_warnings():  # a stage lacks some planned modules; parallelize_module skips them
            warnings.filterwarnings("ignore", message=".*could not be resolved")
            parallelize_module(model, mesh["tp"], plan)
        if model.lm_head is not None and "wte" in model.transformer:
            model.lm_head.weight = model.transformer.wte.weight  # parallelize_module untied them
    if layout.dp_shard > 1:
        dp = mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
        for block in model.transformer.h.values():
            fully_shard(block, mesh=dp)
        fully_shard(model, mesh=dp)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=generator)
    targets = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=generator)
    if layout.pp > 1:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        pipe = PipelineStage(model, stage, layout.pp, torch.device("cpu"), group=mesh["pp"].get_group())
        schedule = ScheduleGPipe(pipe, n_microbatches=MICROBATCHES, loss_fn=loss_of)
        schedule.step(tokens) if stage == 0 else schedule.step(target=targets)
    else:
        loss = loss_of(model(tokens), targets)
        with loss_parallel() if layout.tp > 1 else torch.enable_grad():
            loss.backward()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer.step()
    params = list(model.parameters())
    return {
        "parameters": allocated_bytes(params),
        "gradients": allocated_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state": allocated_bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)),
    }


def zero1_step(rank: int, whole: nn.Module) -> dict:
    """ZeRO-1's sharded optimizer on 4 ranks (uneven rows: a 50-row embedding is 13, 13, 13, 11; gathered in
    many small buckets) against plain AdamW on the same gradients: its weights and its state's bytes."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.strategies.data_parallel.sharded_optimizer import ShardedOptimizer
    from trainer.memory.planner import estimate

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model, reference = TinyGPT(), TinyGPT()
    reference.load_state_dict(model.state_dict())
    sharded = ShardedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01), mesh, bucket_bytes=4096)
    plain = torch.optim.AdamW(reference.parameters(), lr=0.01)
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        for net, optimizer in ((model, sharded), (reference, plain)):
            loss_of(net(tokens), tokens).backward()  # the same gradients on every rank, as after DDP's all-reduce
            optimizer.step()
            optimizer.zero_grad()
    difference = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    planned = estimate(whole, "zero1", dist.get_world_size(), optimizer="adamw").devices[rank]
    state = allocated_bytes(v for s in sharded.optim.state.values() for v in s.values() if torch.is_tensor(v))
    return {"max_difference": difference, "optimizer_state": state, "planned_optimizer_state": planned.optimizer_state}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)  # a hang fails with a traceback
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with torch.device("meta"):
        whole = TinyGPT()
    report: dict = {"rank": rank}
    for layout in LAYOUTS:
        print(f"rank {rank}: {layout.name}", flush=True)
        measured = build_and_step(layout, rank)
        planned = estimate_layout(whole, layout, tp_plan="megatron", pipeline=BOUNDARIES, auto_wrap_policy={Block},
                                  optimizer="adam").devices[rank]  # fmt: skip
        report[layout.name] = {"measured": measured, "planned": {k: getattr(planned, k) for k in measured}}
        dist.barrier()
    report["zero1"] = zero1_step(rank, whole)
    torch.save(report, Path(args.out) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
