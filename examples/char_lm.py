"""A character-level transformer language model trained on this project's own documentation.

Shows gradient accumulation, bf16 autocast, checkpoint/resume and sharded training, offline on a CPU:

    python examples/char_lm.py                                   # well under a minute on a laptop CPU
    python examples/char_lm.py --precision bf16-mixed --accumulate 4
    python examples/char_lm.py --devices 2 --strategy fsdp       # parameters sharded over 2 processes
    python examples/char_lm.py --max-steps 600 --resume          # continue the last run exactly, to step 600

The corpus is every Markdown file of the repository (README and docs/), so nothing is downloaded.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainer import Trainer, TrainModule, seed_everything

ROOT = Path(__file__).resolve().parents[1]


def load_corpus() -> str:
    """All Markdown text of the repository, in a fixed order."""
    files = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])
    return "\n\n".join(path.read_text(encoding="utf-8") for path in files if path.exists())


class CharDataset(Dataset):
    """Windows of ``context + 1`` characters: the model predicts each next character."""

    def __init__(self, ids: torch.Tensor, context: int) -> None:
        self.ids = ids
        self.context = context

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.context
        chunk = self.ids[start : start + self.context + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class CharLM(TrainModule):
    """A small GPT-style model over characters."""

    def __init__(self, vocab: int, context: int = 48, width: int = 64, layers: int = 2, heads: int = 4,
                 lr: float = 3e-3) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.embed(ids) + self.position[:length]
        for block in self.blocks:
            x = block(x, self.mask[:length, :length])
        return self.head(self.norm(x))

    def _loss(self, batch) -> torch.Tensor:
        inputs, targets = batch
        logits = self(inputs)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup = max(total // 20, 1)

        def schedule(step: int) -> float:  # linear warm-up, then cosine decay
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(total - warmup, 1))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, length: int) -> torch.Tensor:
        """Greedy continuation of ``prompt`` (1-D ids) by ``length`` characters."""
        ids = prompt.unsqueeze(0)
        for _ in range(length):
            logits = self(ids[:, -self.hparams.context :])[:, -1]
            ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
        return ids[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--context", type=int, default=48)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--root-dir", default="runs/char_lm")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint (exactly)")
    args = parser.parse_args()

    seed_everything(0)
    torch.set_num_threads(1)  # small matrices: one thread per process is fastest
    text = load_corpus()
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    train = DataLoader(CharDataset(ids[:split], args.context), batch_size=args.batch_size, shuffle=True, drop_last=True)
    val = DataLoader(CharDataset(ids[split:], args.context), batch_size=64)

    module = CharLM(len(vocab), context=args.context, width=args.width)
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, strategy=args.strategy, precision=args.precision,
        accumulate_grad_batches=args.accumulate, max_steps=args.max_steps, val_check_interval=100,
        check_val_every_n_epoch=None, limit_val_batches=8, default_root_dir=args.root_dir, log_every_n_steps=10, gradient_clip_val=1.0,
    )  # fmt: skip
    trainer.fit(module, train, val, ckpt_path="last" if args.resume else None)
    val_loss = trainer.validate(module, val, verbose=False)[0]["val_loss"]
    if trainer.is_global_zero:
        print(f"final validation loss: {val_loss:.3f} (uniform guess: {math.log(len(vocab)):.3f})")
        if args.strategy not in ("fsdp", "zero2"):  # a sharded module's weights live across ranks
            sample = module.generate(ids[:16], 80)
            print("sample:", repr("".join(vocab[i] for i in sample.tolist())))


if __name__ == "__main__":
    main()
