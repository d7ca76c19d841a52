"""Jobs for tests/test_init_layouts.py: modules built every way users write them, their initial weights and
buffers at several layouts (gloo on the CPU), compared by the test with the one-device build.

    python init_zoo.py --out DIR --job four   # 4 ranks: the zoo at fsdp=4, dp_shard=2 x tp=2,
                                              #          ModelParallelStrategy(2, 2), dp_shard=2 x pp=2;
                                              #          a transformers Llama at dp_shard=2 x tp=2 (its TP plan)
    python init_zoo.py --out DIR --job two    # 2 ranks: the zoo at fsdp=2, zero2, pp=2; transformers Llama at fsdp=2
                                              #          and zero2, GPT-2 at fsdp=2 (also seeded per rank);
                                              #          torchtitan's Llama-3 at pp=2; check_init

The zoo (:class:`Zoo`) gathers the constructs deferred initialisation must reproduce: a seed set inside
``configure_model``, ``seed_everything``, a ``torch.Generator`` handed to ``nn.init``, ``torch.random.fork_rng``,
Hugging Face's ``self.apply(self._init_weights)``, the root's ``init_weights()`` calling its submodules'
``init_weights()`` and a submodule's own ``reset_parameters()``, ``trunc_normal_`` (rejection sampling) on a
tensor-parallel weight, buffers computed in ``__init__`` and re-registered in ``init_weights()`` (complex
``polar``/``outer``, ``arange``, a bool mask, ``persistent=False``, ``linspace``), tied weights, and a layer made in
``__init__`` (real tensors) reused by the model built in ``configure_model``.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule, seed_everything
from trainer.strategies import FSDPStrategy, ModelParallelStrategy, NDParallelStrategy
from trainer.strategies.speed.init_check import InitMismatchError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for layout_support
from layout_support import InitialWeights, tp_mesh  # noqa: E402

VOCAB, DIM, LAYERS, SEQ = 32, 16, 2, 8
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None


class Gate(nn.Module):
    """A submodule with its own ``reset_parameters()`` (run by its ``__init__``) and ``init_weights()``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.empty(DIM))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.scale, 0.5, 1.5)

    def init_weights(self) -> None:
        nn.init.trunc_normal_(self.scale, mean=1.0, std=0.1, a=0.8, b=1.2)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc, self.proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)  # column-wise, row-wise under TP
        self.gate = Gate()

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        angles = torch.cat((rope.real, rope.imag), dim=-1)[: x.shape[1]]
        return x + self.gate.scale * self.proj(F.gelu(self.fc(self.norm(x)))) + 0.01 * angles


def rope_table() -> torch.Tensor:
    inverse = 1.0 / (10000 ** (torch.arange(0, DIM, 2).float() / DIM))
    angles = torch.outer(torch.arange(SEQ).float(), inverse)
    return torch.polar(torch.ones_like(angles), angles)  # complex64


class ZooNet(nn.Module):
    """Skips what another pipeline stage holds; its buffers are every block's, on the root."""

    def __init__(self, stem: nn.Module, tie: bool) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.stem = stem  # made in the TrainModule's __init__ (real tensors), reused here
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight
        self.register_buffer("rope", rope_table(), persistent=False)
        self.register_buffer("positions", torch.arange(SEQ), persistent=False)
        self.register_buffer("mask", torch.ones(SEQ, SEQ, dtype=torch.bool).tril())
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:  # Hugging Face's style
        if isinstance(module, nn.Linear) and module is not self.stem:
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=0.02)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:
            h = self.stem(self.wte(h))
        for block in self.blocks:
            h = block(h, self.rope)
        if self.norm is not None:
            h = self.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


class Zoo(TrainModule):
    def __init__(self, tie: bool = True, split_points: Optional[list[str]] = None) -> None:
        super().__init__()
        self.stem = nn.Linear(DIM, DIM)  # built here, before any strategy: real tensors
        self.tie = tie
        if split_points is not None:
            self.pipeline_split_points = split_points
        self.model: Optional[ZooNet] = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        torch.manual_seed(1234)  # a seed inside configure_model
        self.model = ZooNet(self.stem, self.tie)
        with torch.random.fork_rng(devices=[]):  # a draw that leaves the generator where it was
            torch.manual_seed(7)
            nn.init.normal_(self.model.norm.weight, mean=1.0, std=0.1)
        generator = torch.Generator().manual_seed(3)  # a generator object handed to nn.init
        nn.init.uniform_(self.model.blocks[0].fc.bias, -0.1, 0.1, generator=generator)
        nn.init.normal_(self.model.blocks[1].fc.bias, std=0.1, generator=generator)
        seed_everything(11)
        nn.init.normal_(self.model.blocks[1].proj.bias, std=0.05)
        mesh = tp_mesh(self)
        if mesh is not None:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            for block in self.model.blocks:
                parallelize_module(block, mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})

    def init_weights(self) -> None:
        """torchtitan's convention, run by the Trainer after configure_model on every layout."""
        for block in self.model.blocks:
            block.gate.init_weights()
        nn.init.trunc_normal_(self.model.blocks[0].proj.weight, std=0.02, a=-0.03, b=0.03)  # a TP weight under tp
        self.model.rope = rope_table() * 2  # a buffer computed again
        self.model.register_buffer("offsets", torch.linspace(0, 1, DIM), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def pipeline_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        return self.pipeline_loss(self(tokens), target)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def pipelined_zoo() -> Zoo:
    """The zoo cut after its first block (a weight tied across pipeline stages is refused: none here)."""
    return Zoo(tie=False, split_points=["model.blocks.1"])


class LightningZoo(Zoo):
    """What a Lightning ModelParallelStrategy user writes: the TP plan and fully_shard in configure_model."""

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from torch.distributed.fsdp import fully_shard

        super().configure_model()
        for block in self.model.blocks:
            fully_shard(block, mesh=self.device_mesh["data_parallel"])


class HFModule(TrainModule):
    """A transformers causal LM built from a tiny config in configure_model."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.model: Any = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_config(hf_config(self.kind))
        mesh = tp_mesh(self)
        if mesh is not None:  # Llama's own tensor-parallel plan, applied by hand
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                    "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                    "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                    "mlp.down_proj": RowwiseParallel()}  # fmt: skip
            for layer in self.model.model.layers:
                parallelize_module(layer, mesh, plan)

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        logits = self.model(tokens).logits
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def hf_config(kind: str) -> Any:
    from transformers import GPT2Config, LlamaConfig

    if kind == "llama":
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ)  # fmt: skip
    return GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
                      eos_token_id=0)  # fmt: skip


class Titan(TrainModule):
    """torchtitan's Llama-3, unchanged, held as ``self.model``; ``init_weights`` as torchtitan's trainer calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.model: Any = None
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from torchtitan.models.llama3.model.args import TransformerModelArgs
        from torchtitan.models.llama3.model.model import Transformer

        self.model = Transformer(TransformerModelArgs(dim=32, n_layers=2, n_heads=4, vocab_size=VOCAB,
                                                      max_seq_len=SEQ))  # fmt: skip

    def init_weights(self) -> None:
        self.model.init_weights(buffer_device=torch.device("cpu"))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def pipeline_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        return self.pipeline_loss(self(tokens), target)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        loss = outputs["loss"]
        self.losses.append(float(loss.full_tensor() if hasattr(loss, "full_tensor") else loss))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class InitsDifferentlyOnMeta(Zoo):
    """Code that notices it is on meta and skips an init there: silently other weights, unless checked."""

    def init_weights(self) -> None:
        super().init_weights()
        if not self.model.norm.weight.is_meta:
            nn.init.constant_(self.model.norm.weight, 0.5)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (8, SEQ + 1), generator=generator)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def fit(strategy: Any, devices: int, make: Callable[[], TrainModule], steps: int = 1, seed: Any = 0,
        **trainer_args: Any) -> tuple[TrainModule, dict, bool]:  # fmt: skip
    """Seeds (``seed(rank)`` when callable), makes the module, records its initial weights and trains ``steps``
    steps. Returns the module, the initial weights and whether the build fell back to an eager one (the warning)."""
    rank = int(os.environ.get("RANK", "0"))
    seed_everything(seed(rank) if callable(seed) else seed)
    module = make()
    initial = InitialWeights()
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[initial], **trainer_args)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, DataLoader(dataset(), batch_size=4))
    fell_back = any("could not be recorded" in str(w.message) for w in caught)
    return module, initial.weights, fell_back


def four_job() -> dict:
    report: dict = {}
    layouts = {"fsdp4": (FSDPStrategy(), Zoo), "dp2_tp2": (NDParallelStrategy(dp_shard=2, tp=2), Zoo),
               "lightning_2x2": (ModelParallelStrategy(2, 2), LightningZoo),
               "dp2_pp2": (NDParallelStrategy(dp_shard=2, pp=2), pipelined_zoo)}  # fmt: skip
    if HAS_TRANSFORMERS:
        layouts["llama_dp2_tp2"] = (NDParallelStrategy(dp_shard=2, tp=2), lambda: HFModule("llama"))
    for name, (strategy, module) in layouts.items():
        _, report[name], report[f"{name}_fell_back"] = fit(strategy, 4, module)
    return report


def two_job() -> dict:
    report: dict = {}
    layouts = {"fsdp2": ("fsdp", Zoo), "zero2": ("zero2", Zoo),
               "pp2": (NDParallelStrategy(dp_shard=1, pp=2), pipelined_zoo)}  # fmt: skip
    if HAS_TRANSFORMERS:
        layouts["llama_fsdp"] = ("fsdp", lambda: HFModule("llama"))
        layouts["llama_zero2"] = ("zero2", lambda: HFModule("llama"))
        layouts["gpt2_fsdp"] = ("fsdp", lambda: HFModule("gpt2"))
    for name, (strategy, module) in layouts.items():
        _, report[name], report[f"{name}_fell_back"] = fit(strategy, 2, module)
    if HAS_TRANSFORMERS:  # each rank seeded differently: the model is still one, the one rank 0's seed gives
        _, report["gpt2_fsdp_seed_per_rank"], _ = fit("fsdp", 2, lambda: HFModule("gpt2"), seed=lambda rank: 100 + rank)
    if HAS_TORCHTITAN:
        module, report["titan_pp2"], report["titan_pp2_fell_back"] = fit(
            NDParallelStrategy(dp_shard=1, pp=2, microbatches=4), 2, Titan, steps=3)
        report["titan_pp2_losses"] = module.losses
    module, _, _ = fit("fsdp", 2, Zoo, check_init=True)
    report["check_init_passed"] = module.model is not None
    try:
        fit("fsdp", 2, InitsDifferentlyOnMeta, check_init=True)
    except InitMismatchError as err:
        report["check_init_error"] = str(err)
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--job", required=True, choices=("four", "two"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(500, exit=True)  # a hang fails with a traceback
    report = {"four": four_job, "two": two_job}[args.job]()
    report["rank"] = torch.distributed.get_rank()
    torch.save(report, Path(args.out) / f"rank{report['rank']}.pt")


if __name__ == "__main__":
    main()
