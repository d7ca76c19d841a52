"""Jobs for tests/test_mesh_parallel.py: one tiny transformer trained at many layouts of one device mesh.
Every process writes ``rank<global rank>.pt`` into ``--out``.

    python mesh_train.py --out DIR --job four     # 4 ranks: FSDP2×TP, (dp_shard=2, pp=2), Lightning's form,
                                                 # HSDP, resumes at dp_shard=4 and at (tp=2, pp=2)
    python mesh_train.py --out DIR --job two      # 2 ranks: TP, PP with GPipe and with 1F1B
    python mesh_train.py --out DIR --job memory   # 2 ranks: deferred init under fsdp, peak RSS per rank

Every training fit sees the same 12 batches of 8 sequences in the same order (no shuffling: rank r of the data-
parallel ranks takes samples r, r + dp, ...; a batch of 8/dp per rank holds what one process's batch of 8 holds),
accumulates 2 batches per step, clips the norm at CLIP and uses SGD with momentum, so its weights and its loss at every batch
can be compared with one process's (:func:`reference_fit`).
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
import zlib
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer.callbacks import Callback  # noqa: E402
from trainer.strategies import ConfigurationError, ModelParallelStrategy, NDParallelStrategy  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

VOCAB, DIM, HEADS, LAYERS, SEQ = 32, 16, 4, 4, 6
N_SAMPLES, BATCH, ACCUMULATE, CLIP, LR, EPOCHS = 48, 8, 2, 0.05, 1.0, 2
SAVE_AT = 2  # optimizer steps: mid-epoch (3 steps per epoch)
MID_WINDOW = 4  # the micro-batch after which the pipeline run saves: the first of an accumulation window
HANG_DUMP_S = 200


class Block(nn.Module):
    """Pre-norm attention and MLP; heads are found from the local width, so a tensor-parallel half has half."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(3))
        # No key bias: softmax ignores it, so its gradient is rounding noise, which Adam would turn into full steps.
        self.k = nn.Linear(DIM, DIM, bias=False)
        self.up, self.down = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, -1, DIM // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(torch.relu(self.up(self.norm2(x))))


TP_BLOCK_PLAN = ("q", "k", "v", "up"), ("o", "down")  # column-wise, row-wise


class TinyLM(TrainModule):
    """Built in configure_model (deferred init); its forward skips what another pipeline stage holds."""

    def __init__(self, split_points: Optional[list[str]] = ("layers.2",)) -> None:
        super().__init__()
        self.embed = self.layers = self.norm = self.head = None
        if split_points is not None:
            self.pipeline_split_points = list(split_points)
        self.step_losses: list[float] = []

    def configure_model(self) -> None:
        if self.layers is not None:
            return
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)
        if not self.embed.weight.is_meta:  # built eagerly (one process): the same values as materialised
            self.init_weights()
        mesh = self.device_mesh
        if mesh is not None and "tp" in (mesh.mesh_dim_names or ()) and mesh["tp"].size() > 1:
            apply_tensor_parallel(self, mesh["tp"])

    @torch.no_grad()
    def init_weights(self) -> None:
        """The same values at every layout: each full tensor from its name, each rank keeping its part."""
        from torch.distributed.tensor import distribute_tensor

        for name, param in self.named_parameters():
            generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            full = torch.randn(param.shape, generator=generator) * 0.3
            if hasattr(param, "device_mesh"):
                full = distribute_tensor(full, param.device_mesh, param.placements)
            param.copy_(full)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) if self.embed is not None else tokens
        for block in self.layers.values():
            h = block(h)
        return self.head(self.norm(h)) if self.head is not None else h

    def pipeline_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        return self.pipeline_loss(self(tokens), target)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.log("train_loss", outputs["loss"])  # under pipeline parallel: the last stage's, on every rank
        self.step_losses.append(float(self.trainer.callback_metrics["train_loss"]))

    def validation_step(self, batch, batch_idx):
        tokens, target = batch
        self.log("val_loss", self.pipeline_loss(self(tokens), target), sync_dist=True)

    def configure_optimizers(self):
        # SGD with momentum: the clipping coefficient (the global norm's) shows directly in every update, which
        # Adam's per-element normalisation would hide; the momentum buffers are state to reshard on resume.
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9, weight_decay=0.01)


def apply_tensor_parallel(module: TinyLM, tp_mesh: Any) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    columns, rows = TP_BLOCK_PLAN
    plan = {**{name: ColwiseParallel() for name in columns}, **{name: RowwiseParallel() for name in rows}}
    for block in module.layers.values():
        parallelize_module(block, tp_mesh, plan)
    parallelize_module(module, tp_mesh, {"embed": RowwiseParallel(input_layouts=Replicate()),
                                         "head": ColwiseParallel(output_layouts=Replicate())})  # fmt: skip


class LightningStyleLM(TinyLM):
    """What a Lightning ModelParallelStrategy user writes: TP plan and fully_shard in configure_model."""

    def configure_model(self) -> None:
        if self.layers is not None:
            return
        from torch.distributed.fsdp import fully_shard

        super().configure_model()
        tp_mesh, dp_mesh = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
        apply_tensor_parallel(self, tp_mesh)
        for block in self.layers.values():
            fully_shard(block, mesh=dp_mesh)
        fully_shard(self.head, mesh=dp_mesh)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (N_SAMPLES, SEQ + 1), generator=generator)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class SaveAt(Callback):
    """Save a checkpoint once ``global_step`` reaches ``step`` (or after micro-batch ``batch`` of the first epoch)."""

    def __init__(self, path: Path, step: Optional[int] = None, batch: Optional[int] = None) -> None:
        self.path, self.step, self.batch, self.done = path, step, batch, False

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        due = trainer.global_step == self.step if self.batch is None else batch_idx == self.batch
        if not self.done and due:
            trainer.save_checkpoint(self.path)
            self.done = True


def fit(strategy: Any, devices: int, dp: int, module: Optional[TinyLM] = None, ckpt_path: Any = None,
        callbacks: tuple = (), validate: bool = False, **overrides: Any) -> tuple[Trainer, TinyLM]:  # fmt: skip
    """One fit of the shared recipe; ``dp`` data-parallel ranks each take BATCH // dp samples per batch."""
    module = module or TinyLM()
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=EPOCHS,
                      accumulate_grad_batches=ACCUMULATE, gradient_clip_val=CLIP, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, callbacks=list(callbacks), **overrides)  # fmt: skip
    val = DataLoader(TensorDataset(*dataset()[:16]), batch_size=BATCH // dp) if validate else None
    trainer.fit(module, DataLoader(dataset(), batch_size=BATCH // dp), val, ckpt_path=ckpt_path)
    return trainer, module


def reference_fit(ckpt_path: Any = None) -> tuple[Trainer, TinyLM]:
    """The same recipe in one process (in the test's own process)."""
    return fit("auto", 1, 1, ckpt_path=ckpt_path, validate=True)


def local_parameter_bytes(module: nn.Module) -> int:
    total = 0
    for p in module.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def record(trainer: Trainer, module: TinyLM, out: Path, name: str, report: dict, save: bool = True) -> None:
    """Losses, local parameter bytes and (in a sharded folder) the final state of one fit."""
    if save:
        trainer.save_checkpoint(out / f"{name}.ckpt")
    report[name] = {"losses": module.step_losses, "global_step": trainer.global_step,
                    "parameter_bytes": local_parameter_bytes(module),
                    "val_loss": float(trainer.callback_metrics["val_loss"]) if "val_loss" in trainer.callback_metrics else None}  # fmt: skip


def four_job(out: Path) -> dict:
    report: dict = {}
    saved = out / "fsdp_tp_at_2.ckpt"
    trainer, module = fit(NDParallelStrategy(dp_shard=2, tp=2), 4, 2, callbacks=(SaveAt(saved, SAVE_AT),))
    record(trainer, module, out, "fsdp_tp", report)
    trainer, module = fit(NDParallelStrategy(dp_shard=2, pp=2, pipeline_schedule="GPipe", microbatches=2), 4, 2,
                          validate=True)  # fmt: skip
    record(trainer, module, out, "fsdp_pp", report)
    trainer, module = fit(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2), 4, 2,
                          module=LightningStyleLM())  # fmt: skip
    record(trainer, module, out, "lightning", report)
    report["lightning"]["dims"] = trainer.strategy.device_mesh.mesh_dim_names
    trainer, module = fit(NDParallelStrategy(dp_replicate=2, dp_shard=2), 4, 4)  # HSDP
    record(trainer, module, out, "hsdp", report)
    # The step-2 checkpoint of the (dp_shard=2, tp=2) run continues at other layouts.
    trainer, module = fit(NDParallelStrategy(dp_shard=4), 4, 4, ckpt_path=saved)
    record(trainer, module, out, "resumed_dp4", report)
    trainer, module = fit(NDParallelStrategy(tp=2, pp=2), 4, 1, ckpt_path=saved)
    record(trainer, module, out, "resumed_tp_pp", report)
    report["rank"] = trainer.global_rank
    return report


def two_job(out: Path) -> dict:
    report: dict = {}
    trainer, module = fit(NDParallelStrategy(dp_shard=1, tp=2), 2, 1)
    record(trainer, module, out, "tp", report)
    mid_window = out / "pp_mid_window.ckpt"
    trainer, module = fit(NDParallelStrategy(dp_shard=1, pp=2, pipeline_schedule="GPipe", microbatches=4), 2, 1,
                          callbacks=(SaveAt(mid_window, batch=MID_WINDOW),))  # fmt: skip
    record(trainer, module, out, "pp_gpipe", report)
    # Inside an accumulation window: the window's first gradients are in the checkpoint, resharded for TP.
    trainer, module = fit(NDParallelStrategy(dp_shard=1, tp=2), 2, 1, ckpt_path=mid_window)
    record(trainer, module, out, "tp_from_mid_window", report)
    # 1F1B, stages chosen by the device-map planner (no split points on the module).
    trainer, module = fit(NDParallelStrategy(dp_shard=1, pp=2, pipeline_schedule="1F1B"), 2, 1,
                          module=TinyLM(split_points=None))  # fmt: skip
    record(trainer, module, out, "pp_1f1b", report)
    report["pp_1f1b"]["stage_parameters"] = [name for name, _ in module.named_parameters()]
    try:
        fit(NDParallelStrategy(dp_shard=1, pp=2, microbatches=3), 2, 1)
    except ConfigurationError as err:
        report["indivisible_batch_error"] = str(err)
    report["rank"] = trainer.global_rank
    return report


# ---------------------------------------------------------------------------------------------- memory
MEMORY_WIDTH, MEMORY_LAYERS = 768, 64


class FrozenBase(TrainModule):
    """A large frozen stack with a small trainable head (fine-tuning): most memory is weights."""

    def __init__(self, width: int = MEMORY_WIDTH) -> None:
        super().__init__()
        self.width = width

    def configure_model(self) -> None:
        if hasattr(self, "base"):
            return
        self.base = nn.Sequential(*(nn.Linear(self.width, self.width) for _ in range(MEMORY_LAYERS)))
        self.base.requires_grad_(False)
        self.head = nn.Linear(self.width, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.head(torch.tanh(self.base(x))).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.head.parameters(), lr=0.1)


def rss_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM (the peak resident set) to the current resident set


def memory_job(out: Path) -> dict:
    """Peak RSS growth of a fit (and of a resume from its checkpoint) against the model's full fp32 size. A first
    fit of a small model of the same kind loads the libraries and joins the process group, so that what is
    measured is the model."""
    from trainer.strategies import FSDPStrategy

    full_fp32 = MEMORY_LAYERS * (MEMORY_WIDTH * MEMORY_WIDTH + MEMORY_WIDTH) * 4

    def run(module: FrozenBase, steps: int, **fit_args: Any) -> tuple[int, Trainer]:
        trainer = Trainer(accelerator="cpu", devices=2, strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}),
                          precision="bf16-true", max_steps=steps, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        data = DataLoader(TensorDataset(torch.randn(8, module.width)), batch_size=2)
        reset_peak_rss()
        before = rss_bytes("VmRSS")
        trainer.fit(module, data, **fit_args)
        return rss_bytes("VmHWM") - before, trainer

    run(FrozenBase(width=64), 2)
    growth, trainer = run(FrozenBase(), 2)
    folder = out / "frozen.ckpt"
    trainer.save_checkpoint(folder)
    resumed_growth, trainer = run(FrozenBase(), 4, ckpt_path=folder)  # the checkpoint loads shard by shard
    return {"rank": trainer.global_rank, "full_fp32": full_fp32, "growth": growth, "resumed_growth": resumed_growth,
            "resumed_step": trainer.global_step}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--job", required=True, choices=("four", "two", "memory"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)  # a hang fails with a traceback
    out = Path(args.out)
    report = {"four": four_job, "two": two_job, "memory": memory_job}[args.job](out)
    torch.save(report, out / f"rank{report['rank']}.pt")


if __name__ == "__main__":
    main()
