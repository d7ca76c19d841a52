"""A nanoGPT-shaped character model trained by a hand-written loop and by the Trainer, eager and compiled.

    python benchmarks/gpt.py                  # CPU: nanoGPT's CPU shape (4 layers, 4 heads, 128 wide, context 64, batch 12)
    python benchmarks/gpt.py --size gpu       # CUDA: nanoGPT's shakespeare-char shape (6 layers, 6 heads, 384 wide,
                                              #   context 256, batch 64) in bf16-mixed and 16-mixed
    python benchmarks/gpt.py --dry-run        # a tiny model for a few steps on the CPU: every path runs (the tests do this)

Both sides train the same model (same seed, same batches from the same DataLoader: random windows of the
repository's Markdown files, as nanoGPT's ``get_batch``), AdamW, norm clipping at 1.0, the precision's autocast
and (16-mixed) gradient scaler; the Trainer's module also logs its loss every step, as users do. The hand-written
loop compiles with ``model.compile()``, the Trainer with ``Trainer(compile=...)``. Runs alternate (hand-written,
Trainer, hand-written, ...) and each is timed from the end of its warm-up steps to its last step (with a CUDA
synchronise at both ends), so machine load affects both alike; the ratios are medians of per-round ratios.

Printed, one row per precision and mode: ms/iter of each side, Trainer/hand-written (target <= 1.01), tokens/s
and MFU of the Trainer (peak from ``trainer.callbacks.flops.PEAK_FLOPS``, or ``--peak-flops``), compiled/eager (Trainer),
and the difference of the two sides' last losses (0 on the CPU in float32: the same computation).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.callbacks import Callback  # noqa: E402
from trainer.callbacks.flops import device_peak_flops  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402


@dataclass
class Size:
    layers: int
    heads: int
    width: int
    context: int
    batch: int
    steps: int  # per run, warm-up included
    warmup: int
    repeats: int


SIZES = {
    "cpu": Size(layers=4, heads=4, width=128, context=64, batch=12, steps=40, warmup=10, repeats=3),
    "gpu": Size(layers=6, heads=6, width=384, context=256, batch=64, steps=150, warmup=25, repeats=3),
    "dry": Size(layers=1, heads=2, width=32, context=16, batch=4, steps=4, warmup=2, repeats=1),
}


def corpus_ids() -> tuple[torch.Tensor, int]:
    """The repository's Markdown (README and docs/) as character ids, and the vocabulary size."""
    files = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])
    text = "\n\n".join(path.read_text(encoding="utf-8") for path in files if path.exists())
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long), len(vocab)


class Windows(Dataset):
    """``context + 1`` characters at fixed random offsets (drawn once from a seeded generator)."""

    def __init__(self, ids: torch.Tensor, context: int, count: int) -> None:
        self.ids, self.context = ids, context
        self.offsets = torch.randint(len(ids) - context - 1, (count,), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.offsets[index])
        chunk = self.ids[start : start + self.context + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """nanoGPT's block: pre-norm causal self-attention (scaled_dot_product_attention) and a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, length, width)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(TrainModule):
    """Token and position embeddings, blocks, a final LayerNorm and a head tied to the token embedding."""

    def __init__(self, vocab: int, size: Size) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, size.width)
        self.positions = nn.Embedding(size.context, size.width)
        self.blocks = nn.ModuleList(Block(size.width, size.heads) for _ in range(size.layers))
        self.ln = nn.LayerNorm(size.width)
        self.head = nn.Linear(size.width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        self.apply(self._init)
        for name, param in self.named_parameters():
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * size.layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def training_step(self, batch, batch_idx):
        loss = lm_loss(self(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def tokens_in_batch(self, batch) -> int:
        return batch[0].numel()

    def configure_optimizers(self):
        return adamw(self)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)


class Clock:
    """Times the steps after the warm-up; keeps the last loss."""

    def __init__(self, device: torch.device, warmup: int, steps: int) -> None:
        self.device, self.warmup, self.steps = device, warmup, steps
        self.start = self.seconds = 0.0
        self.loss: Optional[torch.Tensor] = None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def batch_done(self, index: int, loss: torch.Tensor) -> None:
        if index == self.warmup - 1:
            self.start = self._now()
        elif index == self.steps - 1:
            self.seconds = self._now() - self.start
            self.loss = loss.detach().float().cpu()

    @property
    def ms_per_iter(self) -> float:
        return self.seconds / (self.steps - self.warmup) * 1e3


class ClockCallback(Callback):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.clock.batch_done(batch_idx, outputs["loss"])


def make_loader(ids: torch.Tensor, size: Size, device: torch.device) -> DataLoader:
    return DataLoader(Windows(ids, size.context, size.batch * size.steps), batch_size=size.batch, drop_last=True,
                      pin_memory=device.type == "cuda")  # fmt: skip


def run_hand_written(ids, vocab, size, device, precision, compile_options) -> Clock:
    torch.manual_seed(0)
    model = GPT(vocab, size).to(device)
    if compile_options is not None:
        model.compile(**compile_options)
    optimizer = adamw(model)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None
    clock = Clock(device, size.warmup, size.steps)
    parameters = list(model.parameters())
    for index, (x, y) in enumerate(make_loader(ids, size, device)):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = lm_loss(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.batch_done(index, loss)
    return clock


def run_trainer(ids, vocab, size, device, precision, compile_options) -> Clock:
    torch.manual_seed(0)
    module = GPT(vocab, size)
    clock = Clock(device, size.warmup, size.steps)
    trainer = Trainer(accelerator=device.type, devices=1, precision=precision, max_steps=size.steps,
                      gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, compile=compile_options,
                      callbacks=[ClockCallback(clock)])  # fmt: skip
    trainer.fit(module, make_loader(ids, size, device))
    return clock


def flops_per_iter(ids, vocab, size, device, precision) -> float:
    """Training FLOPs of one step (forward and backward, eager), counted by torch.utils.flop_counter."""
    from torch.utils.flop_counter import FlopCounterMode

    model = GPT(vocab, size).to(device)
    x, y = (t.unsqueeze(0).repeat(size.batch, 1).to(device) for t in Windows(ids, size.context, 1)[0])
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = lm_loss(model(x), y)
        loss.backward()
    return float(counter.get_total_flops())


def main(argv: Optional[list[str]] = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, few steps, CPU, aot_eager backend")
    parser.add_argument("--precisions", nargs="+",
                        help="default: bf16-mixed and 16-mixed on a GPU, 32-true on the CPU (and 16-mixed in --dry-run)")
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    parser.add_argument("--backend", default=None, help="torch.compile backend (default inductor; aot_eager in --dry-run)")
    parser.add_argument("--repeats", type=int, help="rounds of (hand-written, Trainer) per row")
    parser.add_argument("--steps", type=int, help="steps per run, warm-up included")
    parser.add_argument("--peak-flops", type=float, help="peak FLOP/s of one device, for MFU (the CPU has no table)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads on the CPU")
    args = parser.parse_args(argv)
    size = SIZES["dry" if args.dry_run else args.size]
    size.repeats = args.repeats or size.repeats
    if args.steps:
        size.steps = max(args.steps, size.warmup + 2)
    device = torch.device("cuda" if args.size == "gpu" and not args.dry_run else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--size gpu needs a CUDA GPU; none is visible (torch.cuda.is_available() is False).")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    precisions = args.precisions or (["bf16-mixed", "16-mixed"] if device.type == "cuda" else
                                     ["32-true", "16-mixed"] if args.dry_run else ["32-true"])  # fmt: skip
    backend = args.backend or ("aot_eager" if args.dry_run else None)
    compiled = {"backend": backend} if backend else {}
    ids, vocab = corpus_ids()
    print(f"gpt.py: {size.layers} layers, {size.heads} heads, {size.width} wide, context {size.context}, batch "
          f"{size.batch}; {size.steps} steps per run ({size.warmup} warm-up), {size.repeats} rounds; device "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; torch {torch.__version__}")  # fmt: skip

    rows: list[dict[str, Any]] = []
    for precision in precisions:
        flops = flops_per_iter(ids, vocab, size, device, precision)
        peak = (args.peak_flops, "--peak-flops") if args.peak_flops else device_peak_flops(device, precision)
        eager_ms = None
        for mode in args.modes:
            options = compiled if mode == "compiled" else None
            run_hand_written(ids, vocab, size, device, precision, options)  # warm-up: compile, allocator, caches
            run_trainer(ids, vocab, size, device, precision, options)
            hand, ours = [], []
            for _ in range(size.repeats):
                hand.append(run_hand_written(ids, vocab, size, device, precision, options))
                ours.append(run_trainer(ids, vocab, size, device, precision, options))
            hand_ms = statistics.median(c.ms_per_iter for c in hand)
            trainer_ms = statistics.median(c.ms_per_iter for c in ours)
            ratio = statistics.median(t.ms_per_iter / h.ms_per_iter for h, t in zip(hand, ours))
            if mode == "eager":
                eager_ms = trainer_ms
            rows.append({
                "precision": precision, "mode": mode, "hand_ms": hand_ms, "trainer_ms": trainer_ms, "ratio": ratio,
                "tokens_per_s": size.batch * size.context / (trainer_ms / 1e3),
                "mfu": flops / (trainer_ms / 1e3) / peak[0] if peak else None,
                "compiled_over_eager": trainer_ms / eager_ms if mode == "compiled" and eager_ms else None,
                "loss_diff": abs(float(hand[-1].loss) - float(ours[-1].loss)),
            })  # fmt: skip
    print_table(rows, flops / (size.batch * size.context))
    return rows


def print_table(rows: list[dict[str, Any]], flops_per_token: float) -> None:
    header = ("precision", "mode", "hand-written ms/iter", "Trainer ms/iter", "Trainer/hand-written", "tokens/s",
              "MFU", "compiled/eager", "loss diff")  # fmt: skip
    lines = [header]
    for row in rows:
        lines.append((row["precision"], row["mode"], f"{row['hand_ms']:.2f}", f"{row['trainer_ms']:.2f}",
                      f"{row['ratio']:.3f}x", f"{row['tokens_per_s']:,.0f}",
                      f"{row['mfu']:.1%}" if row["mfu"] is not None else "-",
                      f"{row['compiled_over_eager']:.3f}x" if row["compiled_over_eager"] is not None else "-",
                      f"{row['loss_diff']:.1e}"))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for index, line in enumerate(lines):
        print("  ".join(cell.rjust(width) if i > 1 else cell.ljust(width) for i, (cell, width) in
                        enumerate(zip(line, widths))))  # fmt: skip
        if index == 0:
            print("  ".join("-" * width for width in widths))
    print(f"training FLOPs per token: {flops_per_token / 1e6:.2f} MFLOP (torch.utils.flop_counter); "
          "target Trainer/hand-written <= 1.01")


if __name__ == "__main__":
    main()
