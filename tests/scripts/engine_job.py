"""Hand-written loops with the Engine for the multi-process tests; every rank writes ``rank<r>.pt`` into OUT.

    python engine_job.py OUT parity            # plain python, devices=2: the Engine starts rank 1 itself
    python engine_job.py OUT killed STATE      # the resumable loop, killed right after save_state mid-epoch
    python engine_job.py OUT resumed STATE     # the same loop from load_state(STATE) to the end
    trainer run --config acc.yaml engine_job.py OUT launched   # Engine() and Trainer() take the launcher's settings
    trainer run --config ds.yaml engine_job.py OUT trainer_launched   # a Trainer() alone fits with the launcher's

``parity``: the Engine loop (gloo, 16-mixed on the CPU, accumulation 2 with a partial last window, clipping,
SGD with momentum, a step LR scheduler, shuffled data), the Trainer on the same module and data, and (rank 0)
one process with the global batch in plain PyTorch; then the collectives, ``save``, ``print`` and loggers;
then the resumable loop run without interruption (the reference for ``killed`` + ``resumed``).
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import sys
from pathlib import Path
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer import Engine, Trainer, TrainModule  # noqa: E402

N, BATCH, ACCUMULATE, EPOCHS, LR, CLIP = 42, 3, 2, 2, 0.1, 0.3  # 7 batches per rank and epoch: windows 2, 2, 2, 1
KILLED, SAVE_AT = 3, 11  # the resumable loop is killed after micro-batch 11: epoch 1, inside a window of 3
HANG_DUMP_S = 100


def dataset(seed: int = 1) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 6, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(N, 1, generator=generator))


def make_net(dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 1))


def make_optimizer(params) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ---------------------------------------------------------------------------------------------- parity
def engine_loop(engine: Engine, net: nn.Module) -> dict:
    optimizer, scheduler = make_optimizer(net.parameters())
    loader = DataLoader(dataset(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader, scheduler = engine.prepare(net, optimizer, loader, scheduler)
    syncs, norms = [], []
    for _ in range(EPOCHS):
        for x, y in loader:
            with engine.accumulate(model):
                engine.backward(F.mse_loss(model(x), y))
                norm = engine.clip_grad_norm_(model.parameters(), CLIP)
                syncs.append(engine.sync_gradients)
                if norm is not None:
                    norms.append(float(norm))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return {"weights": weights(engine.unwrap_model(model)), "syncs": syncs, "norms": norms,
            "lr": scheduler.get_last_lr()[0], "sampler": type(loader.sampler).__name__}  # fmt: skip


class Wrapped(TrainModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer, scheduler = make_optimizer(self.net.parameters())
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def trainer_fit(net: nn.Module) -> dict:
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", precision="16-mixed", accumulate_grad_batches=ACCUMULATE,
        gradient_clip_val=CLIP, max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    module = Wrapped(net)
    trainer.fit(module, DataLoader(dataset(), batch_size=BATCH, shuffle=True))
    return weights(module.net)


def one_process(net: nn.Module, world_size: int) -> dict:
    """Plain PyTorch, one process, global batch world_size * BATCH: the order DistributedSampler splits."""
    optimizer, scheduler = make_optimizer(net.parameters())
    scaler = torch.amp.GradScaler("cpu")
    data = dataset()
    big = world_size * BATCH
    for epoch in range(EPOCHS):
        order = torch.randperm(N, generator=torch.Generator().manual_seed(epoch))
        batches = [order[i : i + big] for i in range(0, N, big)]
        for i, idx in enumerate(batches):
            with torch.autocast("cpu", dtype=torch.float16):
                out = net(data.tensors[0][idx])
            scaler.scale(F.mse_loss(out.float(), data.tensors[1][idx]) / ACCUMULATE).backward()
            if (i + 1) % ACCUMULATE == 0 or i + 1 == len(batches):
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
                scale = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                if scaler.get_scale() >= scale:  # not skipped for inf/nan gradients
                    scheduler.step()
                optimizer.zero_grad()
    return weights(net)


def collectives(engine: Engine, out: Path) -> dict:
    rank = engine.process_index
    engine.save({"rank": rank}, out / f"saved_by_{rank}.pt")  # only rank 0's call writes
    engine.print(f"printed by rank {rank}")
    engine.init_trackers("proj", {"lr": LR})
    engine.log({"value": torch.tensor(float(rank + 1))}, step=1)
    report = {
        "gather": engine.gather(torch.tensor([rank, rank])),
        "gather_scalar": engine.gather(torch.tensor(float(rank))),
        "gather_nested": engine.gather({"a": [torch.tensor([rank])]}),
        "reduce_sum": engine.reduce(torch.tensor(float(rank + 1))),
        "reduce_mean": engine.reduce(torch.tensor(float(rank + 1)), "mean"),
        "broadcast": engine.broadcast({"from": rank}, from_process=1),
        "ranks": (engine.num_processes, engine.process_index, engine.local_process_index,
                  engine.is_main_process, engine.is_local_main_process),  # fmt: skip
        "device": str(engine.device),
    }
    # 7 samples on 2 ranks: the sampler repeats sample 0 as rank 1's last, so both run 2 batches of up to 2.
    samples = engine.prepare(DataLoader(TensorDataset(torch.arange(7), torch.arange(7) * 10), batch_size=2))
    gathered = [(engine.gather(index), engine.gather_for_metrics((index, label))) for index, label in samples]
    report["gather_epoch"] = torch.cat([plain for plain, _ in gathered])
    report["gather_for_metrics_epoch"] = [torch.cat(parts) for parts in zip(*(pair for _, pair in gathered))]
    engine.end_training()
    return report


# ---------------------------------------------------------------------------------------------- exact resume
class Counter:
    """A user's own loop state, saved through register_for_checkpointing."""

    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]


def resumable_loop(engine: Engine, state_dir: Path, save_at: int = 0, resume: bool = False) -> Optional[dict]:
    """Dropout, Adam, a step LR scheduler, a shuffled loader, clipping; ``save_at``: save_state after that many
    micro-batches and return None (test_engine.py also runs it in one process)."""
    torch.manual_seed(999 if resume else 1234)  # a resumed run starts from other weights and RNG
    net = make_net(dropout=0.3)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    loader = DataLoader(dataset(seed=3), batch_size=BATCH, shuffle=True)
    model, optimizer, loader, scheduler = engine.prepare(net, optimizer, loader, scheduler)
    counter = Counter()
    engine.register_for_checkpointing(counter)
    if resume:
        engine.load_state(state_dir)
    for _ in range(loader.epoch, EPOCHS):
        for x, y in loader:
            with engine.accumulate(model):
                engine.backward(F.mse_loss(model(x), y))
                engine.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            counter.batches += 1
            if counter.batches == save_at:
                engine.save_state(state_dir)
                return None
    return {"weights": weights(engine.unwrap_model(model)), "batches": counter.batches,
            "lr": scheduler.get_last_lr()[0]}  # fmt: skip


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)
    settings = dict(accelerator="cpu", devices=2, precision="16-mixed")
    report: dict = {}
    if mode == "launched":
        atexit.register(record_group_at_exit, out)  # registered first, so it runs after the strategy's handler
        engine = Engine()  # everything from the launcher (an Accelerate config file)
        trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
        torch.manual_seed(0)
        result = engine_loop(engine, make_net())
        report.update(settings_of(engine.strategy), trainer=settings_of(trainer.strategy), syncs=result["syncs"],
                      accumulate=engine.gradient_accumulation_steps, threads=os.environ.get("OMP_NUM_THREADS"))  # fmt: skip
        rank = engine.process_index
    elif mode == "trainer_launched":  # only a Trainer, everything from the launcher (e.g. a DeepSpeed file)
        trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, max_epochs=1)  # fmt: skip
        module = Wrapped(make_net())
        trainer.fit(module, DataLoader(dataset(), batch_size=BATCH, shuffle=True))
        strategy = trainer.strategy
        zero = strategy.config.get("zero_optimization", {}) if hasattr(strategy, "config") else {}
        report.update(settings_of(strategy), cls=type(strategy).__name__, stage=zero.get("stage"),
                      offload=zero.get("offload_optimizer", {}).get("device"), accumulate=trainer.accumulate_grad_batches,
                      global_step=trainer.global_step)  # fmt: skip
        rank = trainer.global_rank
    elif mode == "parity":
        engine = Engine(**settings, accumulate_grad_batches=ACCUMULATE, loggers="csv", project_dir=out)
        torch.manual_seed(0)
        net = make_net()
        initial = weights(net)
        report["engine"] = engine_loop(engine, net)
        report["trainer"] = trainer_fit(_fresh(initial))
        if engine.is_main_process:
            report["one_process"] = one_process(_fresh(initial), engine.num_processes)
        report.update(collectives(engine, out))
        resume_engine = Engine(**settings, accumulate_grad_batches=3)
        report["uninterrupted"] = resumable_loop(resume_engine, out / "unused")
        rank = engine.process_index
    else:
        engine = Engine(**settings, accumulate_grad_batches=3)
        state = Path(sys.argv[3])
        report["resumed"] = resumable_loop(engine, state, save_at=SAVE_AT if mode == "killed" else 0,
                                           resume=mode == "resumed")  # fmt: skip
        if report["resumed"] is None:  # saved: die as a killed job would, with no clean-up
            sys.stdout.flush()
            os._exit(KILLED)
        rank = engine.process_index
    torch.save(report, out / f"rank{rank}.pt")


def record_group_at_exit(out: Path) -> None:
    """Whether the process group outlived the script (left to interpreter finalization, gloo can abort)."""
    state = "initialized" if torch.distributed.is_initialized() else "destroyed"
    (out / f"exit{os.environ['RANK']}.txt").write_text(state)


def settings_of(strategy) -> dict:
    return {"precision": strategy.precision.name, "strategy": strategy.strategy_name, "world_size": strategy.world_size,
            "device": str(strategy.root_device)}


def _fresh(initial: dict) -> nn.Module:
    net = make_net()
    net.load_state_dict(initial)
    return net


if __name__ == "__main__":
    main()
