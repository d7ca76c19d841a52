"""The 2-rank job of tests/test_speed.py: compile and activation checkpointing under DDP and FSDP2 (gloo, CPU).

    python tests/scripts/speed_train.py --out DIR       # the Trainer starts rank 1; each rank writes rank<N>.pt

Every fit trains the same 4-block model on the same data, with validation every epoch and a short last
training batch (13 samples per rank, batch 4), so compiled and eager runs can be compared and recompiles counted.
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers

from trainer.callbacks import Callback, ThroughputMonitor  # noqa: E402
from trainer.strategies import DDPStrategy, FSDPStrategy  # noqa: E402
from helpers import Regressor  # noqa: E402
from trainer import Trainer  # noqa: E402
from trainer.profiler.profilers import PyTorchProfiler  # noqa: E402

N_TRAIN, BATCH, EPOCHS, WIDTH = 26, 4, 3, 128
HANG_DUMP_S = 200


class Block(nn.Module):
    """A residual MLP block: what activation checkpointing and FSDP units are chosen by."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Net(Regressor):
    """The test suite's Regressor with four blocks and a head as its network."""

    def __init__(self) -> None:
        super().__init__(features=WIDTH, lr=0.01)
        self.net = nn.Sequential(*(Block() for _ in range(4)), nn.Linear(WIDTH, 1))

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)


class GraphCount(Callback):
    """Dynamo's count of compiled graphs at the end of each validation and of the fit."""

    def __init__(self) -> None:
        self.after_validation: list[int] = []
        self.at_end = 0

    @staticmethod
    def graphs() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    def on_validation_end(self, trainer, module):
        if not trainer.sanity_checking:
            self.after_validation.append(self.graphs())

    def on_fit_end(self, trainer, module):
        self.at_end = self.graphs()


def data() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N_TRAIN, WIDTH, generator=generator)
    y = x[:, :1].tanh()
    return DataLoader(TensorDataset(x, y), batch_size=BATCH), DataLoader(TensorDataset(x[:10], y[:10]), batch_size=3)


def weights(trainer: Trainer, module: nn.Module) -> dict[str, torch.Tensor]:
    if trainer.strategy.strategy_name == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    else:
        state = module.state_dict()
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def fit(strategy, callbacks=(), **options) -> tuple[Trainer, Net]:
    torch.manual_seed(0)
    module = Net()
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=EPOCHS, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=1, callbacks=list(callbacks), **options)  # fmt: skip
    trainer.fit(module, *data())
    return trainer, module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)
    torch.set_num_threads(1)
    from torch._dynamo.testing import CompileCounterWithBackend

    report: dict = {}
    profiler = PyTorchProfiler(dirpath=args.out / "traces", wait=1, warmup=1, active=2)
    trainer, module = fit("ddp", profiler=profiler)  # profiling changes nothing: the reference weights
    report["ddp"] = weights(trainer, module)
    report["trace_files"] = [str(path) for path in profiler.trace_files]
    # 1 MB buckets (the least DDPOptimizer allows) over 2.1 MB of parameters: one subgraph per bucket.
    backend = CompileCounterWithBackend("aot_eager")
    counts = GraphCount()
    trainer, module = fit(DDPStrategy(bucket_cap_mb=1), callbacks=[counts], compile={"backend": backend})
    report["ddp_compiled"] = weights(trainer, module)
    report["ddp_compiled_keys"] = list(module.state_dict())
    report["ddp_subgraphs"] = backend.frame_count
    report["ddp_graphs_after_validation"] = counts.after_validation
    report["ddp_graphs_at_end"] = counts.at_end
    monitor = ThroughputMonitor(peak_flops=1e12)  # FLOPs counted through DDP's hooks and checkpoint recomputes
    trainer, module = fit("ddp", activation_checkpointing=["Block"], callbacks=[monitor])
    report["ddp_checkpointed"] = weights(trainer, module)
    report["ddp_checkpointed_flops"] = monitor.flops_per_batch

    monitor = ThroughputMonitor(peak_flops=1e12)  # ... and through FSDP2's all-gathers and DTensor optimizer step
    trainer, module = fit(FSDPStrategy(auto_wrap_policy={Block}), callbacks=[monitor])
    report["fsdp"] = weights(trainer, module)
    report["fsdp_flops"] = monitor.flops_per_batch
    backend = CompileCounterWithBackend("aot_eager")
    trainer, module = fit(FSDPStrategy(auto_wrap_policy={Block}), activation_checkpointing=["Block"],
                          compile={"backend": backend})  # fmt: skip
    report["fsdp_checkpointed_compiled"] = weights(trainer, module)
    report["fsdp_compiled_frames"] = backend.frame_count
    report["fsdp_compiled_blocks"] = sorted(name for name, m in module.named_modules()
                                            if type(m.__dict__.get("forward")).__name__ == "CompiledForward")  # fmt: skip
    torch.save(report, args.out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
