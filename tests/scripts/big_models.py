"""Jobs for tests/test_big_models.py: a nanoGPT-style model (its own ``self.apply(self._init_weights)``, a scaled
projection init, a RoPE table as a non-persistent buffer on the model's root) held as ``self.model`` by a
TrainModule, built in ``configure_model`` and run at several layouts on the CPU (gloo).

    python big_models.py --out DIR --job four   # 4 ranks: initial weights at fsdp=4, dp_shard=2 x tp=2,
                                                #          ModelParallelStrategy(2, 2), dp_shard=2 x pp=2;
                                                #          init_weights() at tp=2 x pp=2
    python big_models.py --out DIR --job two    # 2 ranks: initial weights at fsdp=2 (also by init_weights()),
                                                #          tp=2, pp=2 (default split);
                                                #          pp=2 training; tp=2 training with and without loss parallel
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import math
import sys
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.strategies import FSDPStrategy, ModelParallelStrategy, NDParallelStrategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for layout_support
from layout_support import InitialWeights, tp_mesh  # noqa: E402

VOCAB, DIM, HEADS, LAYERS, SEQ = 32, 16, 2, 2, 8
STEPS, LR = 3, 0.1


class LayerNorm(nn.Module):
    """nanoGPT's: parameters made with torch.ones / torch.zeros, no reset_parameters()."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (B, T, heads, head_dim) by the angles ``rope`` (T, head_dim / 2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = rope.cos()[:, None, :], rope.sin()[:, None, :]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        head_dim = DIM // HEADS
        q, k, v = (proj(x).view(b, t, -1, head_dim) for proj in (self.q, self.k, self.v))  # local heads under TP
        q, k = rotate(q, rope[:t]), rotate(k, rope[:t])
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = LayerNorm(DIM), Attention(), LayerNorm(DIM)
        self.fc, self.proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope)
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    """Skips what another pipeline stage holds; the RoPE table is every block's, on the root."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        inverse = 1.0 / (10000 ** (torch.arange(0, DIM // HEADS, 2).float() / (DIM // HEADS)))
        self.register_buffer("rope", torch.outer(torch.arange(SEQ).float(), inverse), persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # nanoGPT's scaled init of the residual projections
            if name.endswith("o.weight") or name.endswith("proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * LAYERS))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=0.02)  # Hugging Face's style, through .data

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:
            h = self.wte(h)
        for layer in self.layers:
            h = layer(h, self.rope)
        if self.ln_f is not None:
            h = self.ln_f(h)
        return self.lm_head(h) if self.lm_head is not None else h


class GPTModule(TrainModule):
    def __init__(self, split_points: Optional[list[str]] = None, vocab_parallel: bool = False) -> None:
        super().__init__()
        if split_points is not None:
            self.pipeline_split_points = split_points
        self.vocab_parallel = vocab_parallel
        self.computed: list[float] = []
        self.logged: list[float] = []

    def configure_model(self) -> None:
        if getattr(self, "model", None) is not None:
            return
        self.model = GPT()
        mesh = tp_mesh(self)
        if mesh is not None:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                    "attn.o": RowwiseParallel(), "fc": ColwiseParallel(), "proj": RowwiseParallel()}  # fmt: skip
            for block in self.model.layers:
                parallelize_module(block, mesh, plan)
            if self.vocab_parallel:  # torchtitan's plan: logits stay sharded over the vocabulary
                parallelize_module(self.model, mesh, {"lm_head": ColwiseParallel(use_local_output=False)})

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))

    pipeline_loss = loss

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        loss = self.loss(self(tokens), target)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        loss = outputs["loss"]
        self.computed.append(float(loss.full_tensor() if hasattr(loss, "full_tensor") else loss))
        logged = self.trainer.callback_metrics.get("train_loss")
        if logged is not None:
            self.logged.append(float(logged))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


class TitanStyleGPT(GPTModule):
    """torchtitan's convention: ``init_weights()`` initialises the model; the Trainer runs it after
    ``configure_model()`` on every layout (recorded with the build on ``meta``, run eagerly on one device)."""

    @torch.no_grad()
    def init_weights(self) -> None:
        for name, param in self.model.named_parameters():
            if param.dim() == 2:
                torch.nn.init.trunc_normal_(param, std=0.02, a=-0.04, b=0.04)
            elif name.endswith("bias"):
                param.data.uniform_(-0.01, 0.01)


class LossParallelGPT(GPTModule):
    """Loss parallel as torchtitan runs it: the loss and its backward inside ``loss_parallel()``."""

    def backward_context(self):
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel() if tp_mesh(self) is not None else contextlib.nullcontext()


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (8, SEQ + 1), generator=generator)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def fit(strategy: Any, devices: int, module: Optional[GPTModule] = None, steps: int = 0,
        batch: int = 4) -> tuple[GPTModule, InitialWeights]:  # fmt: skip
    """Seeds 0, builds, records the initial weights and trains ``steps`` steps (at least one batch is run)."""
    torch.manual_seed(0)
    module = module or GPTModule()
    initial = InitialWeights()
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=max(steps, 1), logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[initial], log_every_n_steps=1)  # fmt: skip
    trainer.fit(module, DataLoader(dataset(), batch_size=batch))
    return module, initial


def four_job(out: Path) -> dict:
    report: dict = {}
    layouts = {"fsdp4": (FSDPStrategy(), None), "dp2_tp2": (NDParallelStrategy(dp_shard=2, tp=2), None),
               "lightning_2x2": (ModelParallelStrategy(2, 2), None),
               "dp2_pp2": (NDParallelStrategy(dp_shard=2, pp=2), ["model.layers.1"])}  # fmt: skip
    for name, (strategy, points) in layouts.items():
        _, initial = fit(strategy, 4, GPTModule(split_points=points))
        report[name] = initial.weights
    # init_weights() on tensor-parallel parameters, before the pipeline cut: recorded on the full tensors
    _, initial = fit(NDParallelStrategy(dp_shard=1, tp=2, pp=2), 4, TitanStyleGPT(split_points=["model.layers.1"]))
    report["init_weights_tp2_pp2"] = initial.weights
    report["rank"] = torch.distributed.get_rank()
    return report


def two_job(out: Path) -> dict:
    report: dict = {}
    for name, strategy in {"fsdp2": FSDPStrategy(), "tp2": NDParallelStrategy(dp_shard=1, tp=2)}.items():
        _, initial = fit(strategy, 2)
        report[name] = initial.weights
    _, initial = fit(FSDPStrategy(), 2, TitanStyleGPT())
    report["init_weights_fsdp2"] = initial.weights
    # pp=2 on self.model = GPT(...): the default (byte-balanced) split goes into model.layers
    module, initial = fit(NDParallelStrategy(dp_shard=1, pp=2), 2, steps=STEPS)
    report["pp2"] = initial.weights
    report["pp2_losses"] = module.computed
    report["pp2_final"] = {n: p.detach().clone() for n, p in module.named_parameters()}
    module, _ = fit(NDParallelStrategy(dp_shard=1, tp=2), 2, steps=STEPS)
    report["tp2_losses"], report["tp2_final"] = module.computed, _full_state(module)
    module, _ = fit(NDParallelStrategy(dp_shard=1, tp=2), 2, LossParallelGPT(vocab_parallel=True), steps=STEPS)
    report["loss_parallel_computed"], report["loss_parallel_logged"] = module.computed, module.logged
    report["loss_parallel_final"] = _full_state(module)
    report["rank"] = torch.distributed.get_rank()
    return report


def _full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in module.named_parameters()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--job", required=True, choices=("four", "two"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(500, exit=True)  # a hang fails with a traceback
    out = Path(args.out)
    report = {"four": four_job, "two": two_job}[args.job](out)
    torch.save(report, out / f"rank{report['rank']}.pt")


if __name__ == "__main__":
    main()
