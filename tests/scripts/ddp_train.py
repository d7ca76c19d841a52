"""A tiny DDP job for the multi-process tests. Every process writes ``rank<global rank>.pt`` into ``--out``.

Run as ``python tests/scripts/ddp_train.py --out DIR --devices 2`` (the Trainer starts rank 1 itself),
under torchrun, under SLURM-like variables, or once per "node" with NODE_RANK/MASTER_ADDR set.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer.callbacks import Callback  # noqa: E402
from trainer.loggers import Logger  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

N_TRAIN, N_VAL, BATCH, ACCUMULATE, EPOCHS, LR = 48, 7, 3, 2, 2, 0.1
HANG_DUMP_S = 120  # below the tests' timeout, above any healthy run on a loaded machine


class Indexed(Dataset):
    """Regression data that also returns each sample's index, so a test can see who trained on what."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


class Net(TrainModule):
    def __init__(self, fail_rank: int = -1, fail_batch: int = -1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        self.fail_rank, self.fail_batch = fail_rank, fail_batch
        self.seen: dict[int, list[int]] = {}

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        if self.global_rank == self.fail_rank and batch_idx == self.fail_batch:
            raise RuntimeError(f"boom from rank {self.global_rank}")
        self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
        self.log("rank_value", float(self.global_rank), sync_dist=True, on_step=True, on_epoch=True)
        return F.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


class CallRecorder(Logger):
    """Writes a marker file whenever the Trainer logs through it (the Trainer does so on rank 0 only)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def log_metrics(self, metrics, step=None):
        Path(self.folder, f"logger-pid{os.getpid()}.txt").write_text(repr(sorted(metrics)))


class WrapperProbe(Callback):
    """Records how the strategy wrapped the module while training ran."""

    def __init__(self) -> None:
        self.seen: dict[str, object] = {}

    def on_train_start(self, trainer, module):
        wrapper = trainer.model
        self.seen = {
            "type": type(wrapper).__name__,
            "find_unused_parameters": getattr(wrapper, "find_unused_parameters", None),
            "gradient_as_bucket_view": getattr(wrapper, "gradient_as_bucket_view", None),
        }


def reference_weights(world_size: int, shuffle: bool) -> dict[str, torch.Tensor]:
    """One process, batch world_size*BATCH, the same accumulation: what every DDP rank must end with."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    data = Indexed(N_TRAIN, seed=1)
    big = world_size * BATCH
    for epoch in range(EPOCHS):
        order = torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(epoch)) if shuffle else torch.arange(N_TRAIN)
        batches = [order[i : i + big] for i in range(0, N_TRAIN, big)]
        for i, idx in enumerate(batches):
            loss = F.mse_loss(model(data.x[idx]), data.y[idx]) / ACCUMULATE
            loss.backward()
            if (i + 1) % ACCUMULATE == 0 or i + 1 == len(batches):
                optimizer.step()
                optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def make_trainer(args: argparse.Namespace, strategy, **overrides) -> Trainer:
    settings = dict(
        accelerator="cpu", devices=args.devices if args.devices == "auto" else int(args.devices),
        num_nodes=args.num_nodes, strategy=strategy, max_epochs=EPOCHS, accumulate_grad_batches=ACCUMULATE,
        logger=CallRecorder(args.out), log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=args.out, num_sanity_val_steps=0,
    )
    settings.update(overrides)
    return Trainer(**settings)


def fit(args: argparse.Namespace, shuffle: bool, strategy=None, val: bool = False, fail: bool = True,
        **trainer_overrides):  # fmt: skip
    torch.manual_seed(0)
    model = Net(args.fail_rank, args.fail_batch) if fail else Net()
    trainer = make_trainer(args, strategy or args.strategy, **trainer_overrides)
    train = DataLoader(Indexed(N_TRAIN, seed=1), batch_size=BATCH, shuffle=shuffle)
    trainer.fit(model, train, DataLoader(Indexed(N_VAL, seed=2), batch_size=2) if val else None)
    return trainer, model


def one_process_val_loss(model: nn.Module) -> float:
    data = Indexed(N_VAL, seed=2)
    with torch.no_grad():
        return float(F.mse_loss(model(data.x), data.y))


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", default="2")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--shuffle", action="store_true", help="the first fit shuffles")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-batch", type=int, default=-1)
    parser.add_argument("--fail-later", action="store_true", help="fail in a second Trainer's fit, not the first")
    parser.add_argument("--validate", action="store_true", help="also run validate() on 7 samples")
    parser.add_argument("--fit-val", action="store_true", help="validate on 7 samples inside fit")
    parser.add_argument("--more-fits", action="store_true", help="then a shuffled fit and an uneven-data fit")
    parser.add_argument("--ddp-options", action="store_true", help="pass a DDPStrategy with non-default options")
    args = parser.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)  # a hang fails with a traceback

    strategy = args.strategy
    if args.ddp_options:
        from trainer.strategies import DDPStrategy

        strategy = DDPStrategy(find_unused_parameters=True, gradient_as_bucket_view=True, timeout=60)
    probe = WrapperProbe()
    callbacks: list = [probe]
    if args.fit_val:  # also keep the best checkpoint by val_loss (its bookkeeping must reach a ddp_spawn caller)
        from trainer.callbacks import ModelCheckpoint

        callbacks.append(ModelCheckpoint(monitor="val_loss", save_top_k=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, model = fit(args, args.shuffle, strategy, val=args.fit_val, fail=not args.fail_later,
                             callbacks=callbacks, enable_checkpointing=args.fit_val)  # fmt: skip
    report = {
        "world_size": trainer.world_size,
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "pid": os.getpid(),
        "global_step": trainer.global_step,
        "weights": weights(model),
        "seen": model.seen,
        "rank_value": float(trainer.callback_metrics["rank_value"]),
        "sampler": type(getattr(trainer.train_dataloader, "sampler", None)).__name__,  # None in a ddp_spawn caller
        "wrapper": probe.seen,
        "state": [str(trainer.state.fn), str(trainer.state.status)],  # a ddp_spawn caller adopts rank 0's
    }
    if args.fail_later:  # a later Trainer joins the running job (no launcher of its own), then a rank fails
        fit(args, shuffle=False, fail=True)
    if args.fit_val:
        report["val_loss_in_fit"] = float(trainer.callback_metrics["val_loss"])
        report["best_k_models"] = sorted(trainer.checkpoint_callback.best_k_models)
        report["fit_warnings"] = [str(w.message) for w in caught]
    if args.validate:
        report["validate"] = trainer.validate(model, DataLoader(Indexed(N_VAL, seed=2), batch_size=2), verbose=False)
    report["val_loss_one_process"] = one_process_val_loss(model)
    if trainer.is_global_zero:
        report["reference"] = reference_weights(trainer.world_size, args.shuffle)
    if args.more_fits:
        _, shuffled = fit(args, shuffle=True)
        report["shuffled_seen"] = shuffled.seen
        report["shuffled_weights"] = weights(shuffled)
        if trainer.is_global_zero:
            report["shuffled_reference"] = reference_weights(trainer.world_size, shuffle=True)
        # use_distributed_sampler=False with a different amount of data per rank: must not deadlock.
        torch.manual_seed(0)
        uneven = Net()
        size = 6 * BATCH * (1 + trainer.global_rank)
        uneven_trainer = make_trainer(args, args.strategy, use_distributed_sampler=False, max_epochs=1)
        uneven_trainer.fit(uneven, DataLoader(Indexed(size, seed=3), batch_size=BATCH))
        report["uneven_batches_run"] = len(uneven.seen[0]) // BATCH
        report["uneven_global_step"] = uneven_trainer.global_step
    torch.save(report, Path(args.out, f"rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main()
