"""Deferred initialisation: build time and peak memory of the exact record-and-replay against an eager build.

Each variant runs in a fresh process (so each peak is its own), interleaved over ``--repeats`` rounds; the table
shows medians. The model is GPT-shaped and initialised as Hugging Face models are (the layers' own
``reset_parameters()``, then ``self.apply(self._init_weights)`` draws everything again), with a RoPE table buffer.

- ``eager``: built with real tensors on the CPU (what one device does);
- ``recorded``: built on ``meta`` while recording (random calls also draw on scratch memory, one tensor at a time,
  so the generators move as in the eager build), then materialised in one process (replay);
- ``empty_init``: built on ``meta`` without recording, then ``to_empty`` + ``init_weights()`` (torchtitan's way: the
  cheapest deferred init, with no guarantee the weights equal the code's);
- ``fsdp2`` (``--ranks 2``): the recorded build, sharded by ``fully_shard`` over 2 gloo ranks and materialised: the
  peak of each rank against the whole model.

    python benchmarks/deferred_init.py                # ~134 M parameters (537 MB in float32)
    python benchmarks/deferred_init.py --width 512 --layers 4 --repeats 1   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

VOCAB = 32000


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_model(width: int, layers: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)
            self.norm = nn.LayerNorm(width)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(width, VOCAB, bias=False)
            inverse = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
            self.register_buffer("rope", torch.outer(torch.arange(2048).float(), inverse), persistent=False)
            self.apply(self._init_weights)

        def _init_weights(self, module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

        def init_weights(self) -> None:
            self.rope.copy_(torch.outer(torch.arange(2048).float(),
                                        1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))))  # fmt: skip
            self.apply(lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else None)
            self.apply(self._init_weights)

    return GPT


def child(variant: str, width: int, layers: int, rank: int = 0, warm_up: bool = True) -> dict:
    import torch

    from trainer.strategies.precision.plugins import Precision
    from trainer.strategies.speed.deferred_init import materialize, module_init_context

    torch.set_num_threads(1)
    if warm_up:  # the same path on a tiny model first: imports and one-time set-up are not the build's cost
        child(variant, 16, 1, rank, warm_up=False)
    cpu = torch.device("cpu")
    GPT = make_model(width, layers)
    base = rss_bytes()
    torch.manual_seed(0)
    start = time.perf_counter()
    record_s = 0.0
    replay_peak = 0
    if variant == "eager":
        model = GPT()
    elif variant == "empty_init":
        with torch.device("meta"):
            model = GPT()
        record_s = time.perf_counter() - start
        materialize(model, cpu)
    else:
        with module_init_context(cpu, Precision(), None, meta=True) as context:
            model = GPT()
        record_s = time.perf_counter() - start
        if variant == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        materialize(model, cpu)
        replay_peak = context.recording.replay_peak_bytes
    seconds = time.perf_counter() - start
    full = sum(p.numel() * p.element_size() for p in model.parameters()) + model.rope.numel() * 4
    return {"variant": variant, "seconds": seconds, "record_s": record_s, "growth": peak_bytes() - base,
            "full_bytes": full, "replay_peak": replay_peak, "rank": rank}  # fmt: skip


def fsdp_rank(rank: int, world: int, port: int, width: int, layers: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = child("fsdp2", width, layers, rank)
    dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def run_variant(variant: str, args: argparse.Namespace) -> list[dict]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # freed large blocks go back: the peak is what lived
    command = [sys.executable, __file__, "--child", variant, "--width", str(args.width), "--layers", str(args.layers)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child == "fsdp2":
        import tempfile

        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result")
            port = 29500 + os.getpid() % 1000
            mp.spawn(fsdp_rank, args=(2, port, args.width, args.layers, out), nprocs=2)
            for rank in range(2):
                with open(f"{out}.{rank}") as f:
                    print(f.read())
        return
    if args.child:
        print(json.dumps(child(args.child, args.width, args.layers)))
        return
    variants = ["eager", "recorded", "empty_init", "fsdp2"]
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for variant in variants:
            results[variant].extend(run_variant(variant, args))
    full = results["eager"][0]["full_bytes"]
    eager_s = statistics.median(r["seconds"] for r in results["eager"])
    mb = lambda b: f"{b / 2**20:,.0f} MB"  # noqa: E731
    print(f"model: width {args.width}, {args.layers} layers, {full / 4 / 1e6:.0f} M parameters, {mb(full)} in "
          f"float32; medians of {args.repeats} run(s), 1 thread")  # fmt: skip
    print("| variant | build + materialise | of which on meta | vs eager | peak memory growth | vs whole model | "
          "replay held at most |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for variant in variants:
        rows = results[variant]
        seconds = statistics.median(r["seconds"] for r in rows)
        record = statistics.median(r["record_s"] for r in rows)
        growth = statistics.median(r["growth"] for r in rows) if variant != "fsdp2" else max(
            statistics.median(r["growth"] for r in rows if r["rank"] == rank) for rank in (0, 1))
        replay = statistics.median(r["replay_peak"] for r in rows)
        label = variant + (" (per rank, the larger)" if variant == "fsdp2" else "")
        print(f"| {label} | {seconds:.2f} s | {record:.2f} s | {seconds / eager_s:.2f}x | {mb(growth)} | "
              f"{growth / full:.2f}x | {mb(replay) if replay else '-'} |")  # fmt: skip


if __name__ == "__main__":
    main()
