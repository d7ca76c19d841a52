"""Exporting an FSDP-sharded ``transformers`` model as a Hugging Face folder: ``trainer.hf.save_pretrained`` (each
rank writes its shards, the ranks assemble the output files tensor by tensor) against gather-then-save (the full
state dict gathered on rank 0, then ``model.save_pretrained(state_dict=...)``, what Accelerate scripts do).

A Llama-shaped model is built on ``meta`` and sharded by ``strategy="fsdp"`` over ``--ranks`` gloo ranks on the CPU;
each variant then runs ``--repeats`` times, interleaved; the table shows medians of the wall time and of each
rank's resident-memory growth during the export (sampled every 0.2 ms after returning freed memory to the system),
beside the rank's shards and the whole model.

    python benchmarks/hf_export.py                                # ~135 M parameters (540 MB in float32), 2 ranks
    python benchmarks/hf_export.py --width 512 --layers 4 --repeats 1   # quick
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured(run: Callable[[], None]) -> tuple[float, int]:
    """Wall seconds (the slowest rank's) and this rank's peak RSS growth while ``run`` runs."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    peak, stop = [rss()], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            stop.wait(0.0002)

    sampler = threading.Thread(target=sample, daemon=True)
    before = rss()
    dist.barrier()
    sampler.start()
    start = time.perf_counter()
    run()
    dist.barrier()
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    return seconds, max(peak[0], rss()) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-shard-size", default="50MB")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM, LlamaConfig

    from trainer import Trainer, TrainModule
    from trainer.hf import save_pretrained

    class Holder(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.model: Any = None

        def configure_model(self) -> None:
            if self.model is None:
                config = LlamaConfig(hidden_size=args.width, intermediate_size=args.width * 8 // 3,
                                     num_hidden_layers=args.layers, num_attention_heads=args.width // 64,
                                     vocab_size=args.vocab, max_position_embeddings=64)  # fmt: skip
                self.model = AutoModelForCausalLM.from_config(config)

        def training_step(self, batch, batch_idx):
            return self.model(batch[0]).logits.float().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    module = Holder()
    trainer = Trainer(accelerator="cpu", devices=args.ranks, strategy="fsdp", max_steps=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    tokens = torch.zeros(args.ranks, 8, dtype=torch.long)
    trainer.fit(module, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=1))
    rank = dist.get_rank()
    params = list(module.model.state_dict().values())
    local = sum(p.to_local().numel() * p.element_size() for p in params)
    whole = sum(p.numel() * p.element_size() for p in params)
    root = Path(tempfile.mkdtemp()) if rank == 0 else None
    root = Path(trainer.strategy.broadcast(str(root)))

    def ours() -> None:
        save_pretrained(module, root / "ours", max_shard_size=args.max_shard_size)

    def gathered() -> None:
        full = get_model_state_dict(module.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            module.model.save_pretrained(root / "gathered", state_dict=full, max_shard_size=args.max_shard_size)
        del full

    results: dict[str, list[tuple[float, int]]] = {"save_pretrained (ours)": [], "gather, then save": []}
    for _ in range(args.repeats):
        for name, run in zip(results, (ours, gathered)):
            results[name].append(measured(run))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, results)
    if rank == 0:
        mb = 1e6
        print(f"{whole / mb:.0f} MB model (float32), {args.ranks} ranks, {local / mb:.0f} MB of shards each, "
              f"files of at most {args.max_shard_size}; medians of {args.repeats}")
        print(f"{'variant':<24}{'seconds':>9}{'rank 0 MB':>11}{'max rank MB':>13}{'x model':>9}")
        medians = {}
        for name in results:
            seconds = statistics.median(r[name][i][0] for r in everyone for i in range(args.repeats))
            per_rank = [statistics.median(g for _, g in r[name]) for r in everyone]
            medians[name] = (seconds, max(per_rank))
            print(f"{name:<24}{seconds:>9.2f}{per_rank[0] / mb:>11.0f}{max(per_rank) / mb:>13.0f}"
                  f"{max(per_rank) / whole:>9.2f}")
        (s_ours, m_ours), (s_gather, m_gather) = medians.values()
        print(f"ours / gather-then-save: time {s_ours / s_gather:.2f}x, peak growth {m_ours / m_gather:.2f}x")
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()


if __name__ == "__main__":
    main()
