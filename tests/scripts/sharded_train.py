"""Jobs for tests/test_sharded.py. Every process writes ``rank<global rank>.pt`` into ``--out``.

    python sharded_train.py --out DIR --job strategies      # 2 ranks: ddp/zero1/zero2/fsdp fits, checkpoints
    python sharded_train.py --out DIR --job world1 --resume FOLDER   # 1 rank: fsdp resumes a 2-rank folder
    python sharded_train.py --out DIR --job deepspeed       # 2 ranks: ZeRO-2 and ZeRO-3 (with offload) through DeepSpeed

All fits train the same model on the same data (shuffled, Adam with StepLR, accumulation 2, norm clipping,
validation with sync_dist), so their final weights can be compared across strategies and across resumes.
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer.callbacks import Callback, ModelCheckpoint  # noqa: E402
from trainer.strategies.checkpoint.sharded_checkpoint import consolidate, is_dtensor  # noqa: E402
from trainer.strategies import ConfigurationError  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

N_TRAIN, BATCH, ACCUMULATE, EPOCHS, LR, CLIP = 48, 3, 2, 2, 0.05, 0.5
STOP_AT = 3  # optimizer steps before the interrupted fit stops (mid-epoch: 4 steps per epoch on 2 ranks)
HANG_DUMP_S = 150


class Net(TrainModule):
    """Sizes that ZeRO-1 (whole parameters) and FSDP (rows of each) can both split about evenly in two; the
    one-row parameters leave rank 1 an empty shard."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 1))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.net(x) * self.scale

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.compute_dtype = self.net[0].weight.dtype  # what the layer computes with (FSDP gathers in param_dtype)
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=LR)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 3, gamma=0.5)}


class WideMLP(Net):
    """8 -> 256 -> 256 -> 4: one matrix holds 95% of the parameters, which whole-parameter ZeRO partitions
    cannot split evenly."""

    def __init__(self) -> None:
        TrainModule.__init__(self)
        self.net = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x):
        return self.net(x)


def data(batch: int = BATCH, one_process_order: bool = False, shape: tuple[int, int] = (6, 1)) -> tuple[DataLoader, DataLoader]:
    """Shuffled training data (``shape``: input and target features). ``one_process_order``: without a strategy
    that splits the data, shuffle as the DistributedSampler the Trainer gives 2 ranks does (so batches of
    2*BATCH hold what both ranks' held)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N_TRAIN, shape[0], generator=generator)
    y = x.sum(dim=1, keepdim=True).repeat(1, shape[1]) + 0.1 * torch.randn(N_TRAIN, shape[1], generator=generator)
    dataset = TensorDataset(x, y)
    if one_process_order:
        train = DataLoader(dataset, batch_size=batch, sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=0))
    else:
        train = DataLoader(dataset, batch_size=batch, shuffle=True)
    return train, DataLoader(TensorDataset(x[:10], y[:10]), batch_size=5)


def allocated_bytes(tensors) -> int:
    """Bytes of the storage behind the local part of each of ``tensors``, each storage once: what the rank
    really allocated for them (FSDP2's padded shards included)."""
    storages = {}
    for tensor in tensors:
        storage = (tensor.to_local() if is_dtensor(tensor) else tensor).untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class MemoryProbe(Callback):
    """Bytes of the real tensors this rank holds after the last optimizer step (before zero_grad).

    Implementing ``on_before_zero_grad`` gives Lightning's order: gradients are cleared only before the next
    window's backward, so they are still there at ``on_train_batch_end`` after a step, where this measures.
    """

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self._step = 0

    def on_before_zero_grad(self, trainer, module, optimizer):
        pass  # see the class docstring

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self._step:
            return  # inside an accumulation window
        self._step = trainer.global_step
        optimizer = trainer.optimizers[0]
        local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer there
        self.bytes = {
            "parameters": allocated_bytes(module.parameters()),
            "gradients": allocated_bytes(p.grad for p in module.parameters() if p.grad is not None),
            "optimizer_state": allocated_bytes(v for state in local.state.values() for v in state.values()
                                               if isinstance(v, torch.Tensor)),  # fmt: skip
        }


class SaveMidWindow(Callback):
    """Save after micro-batch ``batch`` of the first epoch: inside an accumulation window when it is odd."""

    def __init__(self, path: Path, batch: int = 4) -> None:
        self.path, self.batch = path, batch

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.current_epoch == 0 and batch_idx == self.batch:
            trainer.save_checkpoint(self.path)


def full_weights(trainer: Trainer, module: nn.Module) -> dict[str, torch.Tensor]:
    """Every rank gets the whole module's weights, whatever the strategy."""
    if trainer.strategy.strategy_name in ("fsdp", "zero2"):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    else:
        state = module.state_dict()
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def plain_sgd(module: nn.Module) -> dict:
    """An optimizer without per-parameter state: a checkpoint holds only its groups' settings."""
    optimizer = torch.optim.SGD(module.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3, gamma=0.5)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def fit(strategy, devices: int = 2, batch: int = BATCH, callbacks=(), ckpt_path=None, one_process_order=False,
        configure_optimizers_early=False, stateless_optimizer=False, module_class=Net, **overrides):
    torch.manual_seed(0)
    module = module_class()
    if stateless_optimizer:
        module.configure_optimizers = lambda: plain_sgd(module)
    if configure_optimizers_early:  # the mistake of building the optimizer before the Trainer shards the module
        optimizer = torch.optim.Adam(module.parameters())
        module.configure_optimizers = lambda: optimizer
    settings = dict(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=EPOCHS,
                    accumulate_grad_batches=ACCUMULATE, gradient_clip_val=CLIP, logger=False,
                    enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    callbacks=list(callbacks))  # fmt: skip
    settings.update(overrides)
    trainer = Trainer(**settings)
    shape = (module.net[0].in_features, module.net[-1].out_features)
    trainer.fit(module, *data(batch, one_process_order, shape), ckpt_path=ckpt_path)
    return trainer, module


def checkpoints(folder: Path, asynchronous: bool = False) -> list[ModelCheckpoint]:
    """Every STOP_AT steps (with last.ckpt) in ``folder``, and at every epoch end in ``folder/epochs``;
    ``asynchronous``: written in the background (``dcp.async_save``)."""
    return [ModelCheckpoint(dirpath=folder, every_n_train_steps=STOP_AT, save_top_k=-1, save_last=True,
                            asynchronous=asynchronous),
            ModelCheckpoint(dirpath=folder / "epochs", save_top_k=-1, asynchronous=asynchronous)]  # fmt: skip


def strategies_job(out: Path) -> dict:
    report: dict = {}
    for name in ("ddp", "zero1", "zero2", "fsdp"):
        probe = MemoryProbe()
        callbacks = [probe] + ([SaveMidWindow(out / "mid_window.ckpt")] if name == "fsdp" else [])
        strategy = name
        if name == "fsdp":
            from trainer.strategies import FSDPStrategy

            strategy = FSDPStrategy(auto_wrap_policy={nn.Linear})
        trainer, module = fit(strategy, callbacks=callbacks)
        report[name] = {"weights": full_weights(trainer, module), "bytes": probe.bytes,
                        "global_step": trainer.global_step, "optimizer": type(trainer.optimizers[0]).__name__,
                        "val_loss": float(trainer.callback_metrics["val_loss"])}  # fmt: skip
    rank = trainer.global_rank

    # ZeRO-1 on a model with one dominant matrix: each rank's share of the optimizer state.
    for name in ("ddp", "zero1"):
        probe = MemoryProbe()
        trainer, module = fit(name, callbacks=[probe], module_class=WideMLP, max_steps=2)
        report[f"{name}_wide"] = {"bytes": probe.bytes, "weights": full_weights(trainer, module)}

    # Interrupted at STOP_AT steps, resumed from the newest sharded folder ("last"); zero1's saved asynchronously.
    for name in ("fsdp", "zero1"):
        folder = out / f"ckpt_{name}"
        trainer, module = fit(name, callbacks=checkpoints(folder, asynchronous=name == "zero1"), max_steps=STOP_AT)
        report[f"{name}_at_stop"] = full_weights(trainer, module)
        trainer, module = fit(name, callbacks=checkpoints(folder), ckpt_path="last")
        report[f"{name}_resumed"] = full_weights(trainer, module)
        report[f"{name}_resumed_from"] = trainer.ckpt_path

    # ZeRO-1 with state_dict_type="full": one file, the optimizer state gathered on rank 0; resumed from it.
    from trainer.strategies import ZeroStrategy

    folder = out / "ckpt_zero1_full"
    fit(ZeroStrategy(stage=1, state_dict_type="full"), callbacks=checkpoints(folder), max_steps=STOP_AT)
    trainer, module = fit(ZeroStrategy(stage=1, state_dict_type="full"), callbacks=checkpoints(folder), ckpt_path="last")
    report["zero1_full_resumed"] = full_weights(trainer, module)

    # Plain SGD keeps no per-parameter state: resuming restores the groups' settings (the decayed LR).
    folder = out / "ckpt_zero2_sgd"
    trainer, module = fit("zero2", stateless_optimizer=True)
    report["zero2_sgd_uninterrupted"] = full_weights(trainer, module)
    fit("zero2", stateless_optimizer=True, callbacks=checkpoints(folder), max_steps=STOP_AT)
    trainer, module = fit("zero2", stateless_optimizer=True, callbacks=checkpoints(folder), ckpt_path="last")
    report["zero2_sgd_resumed"] = full_weights(trainer, module)
    report["zero2_sgd_resumed_lr"] = trainer.optimizers[0].param_groups[0]["lr"]

    # A full checkpoint file (consolidated from the sharded folder) loaded into a sharded run.
    full_file = out / "consolidated_at_stop.ckpt"
    if rank == 0:
        consolidate(out / "ckpt_fsdp" / f"epoch=0-step={STOP_AT}.ckpt", full_file)
    trainer.strategy.barrier()
    trainer, module = fit("fsdp", ckpt_path=str(full_file))
    report["fsdp_from_full_file"] = full_weights(trainer, module)

    # Saved inside an accumulation window (FSDP had already reduce-scattered the window's gradients).
    trainer, module = fit("fsdp", ckpt_path=str(out / "mid_window.ckpt"))
    report["fsdp_from_mid_window"] = full_weights(trainer, module)

    # A folder written by FSDP resumed by ZeRO-1 (optimizer state resharded from FSDP's layout to ZeRO's).
    trainer, module = fit("zero1", ckpt_path=str(out / "ckpt_fsdp" / f"epoch=0-step={STOP_AT}.ckpt"))
    report["zero1_from_fsdp_folder"] = full_weights(trainer, module)

    # Mixed precision from the plugin: bf16 compute, float32 master shards.
    trainer, module = fit("fsdp", precision="bf16-mixed")
    report["fsdp_bf16"] = {"compute_dtype": module.compute_dtype, "weights": full_weights(trainer, module),
                           "stored_dtypes": {p.dtype for p in module.parameters()}}  # fmt: skip

    # An optimizer built before the module was sharded is refused with advice.
    try:
        fit("fsdp", configure_optimizers_early=True)
    except ConfigurationError as err:
        report["early_optimizer_error"] = str(err)
    report["rank"] = rank
    return report


def world1_job(resume: str) -> dict:
    """One rank continues a folder two ranks wrote at an epoch end; batches twice as large cover the same
    samples per step as the two ranks' batches did."""
    trainer, module = fit("fsdp", devices=1, batch=2 * BATCH, ckpt_path=resume)
    return {"rank": trainer.global_rank, "world_size": trainer.world_size, "weights": full_weights(trainer, module),
            "global_step": trainer.global_step}  # fmt: skip


def deepspeed_job(out: Path) -> dict:
    """DeepSpeed on CPU ranks: ZeRO-2 (a full fit, and one interrupted at STOP_AT steps then resumed from its
    folder), ZeRO-2 with the optimizer offloaded to CPU memory, and ZeRO-3 with optimizer and parameters offloaded
    (its checkpoints also hold the gathered weights, as Accelerate's zero3_save_16bit_model asks)."""
    import deepspeed

    from trainer.strategies.data_parallel.deepspeed import DeepSpeedStrategy

    def strategy(**options) -> DeepSpeedStrategy:
        return DeepSpeedStrategy(config={"gradient_clipping": CLIP}, **{"stage": 2, **options})

    def weights(module: nn.Module) -> dict[str, torch.Tensor]:
        with deepspeed.zero.GatheredParameters(list(module.parameters())):  # ZeRO-3 holds partitions: gather them
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}

    trainer, module = fit(strategy())
    report = {"rank": trainer.global_rank, "weights": weights(module), "global_step": trainer.global_step}
    folder = out / "ckpt_deepspeed"
    fit(strategy(), callbacks=checkpoints(folder), max_steps=STOP_AT)
    trainer, module = fit(strategy(), callbacks=checkpoints(folder), ckpt_path="last")
    report.update(resumed=weights(module), resumed_from=trainer.ckpt_path)
    trainer, module = fit(strategy(offload_optimizer="cpu"))
    report["offload"] = {"weights": weights(module), "global_step": trainer.global_step,
                         "device": trainer.strategy.config["zero_optimization"]["offload_optimizer"]["device"]}  # fmt: skip
    stage3 = out / "ckpt_zero3"
    trainer, module = fit(strategy(stage=3, offload_optimizer=True, offload_parameters=True, save_16bit_model=True),
                          callbacks=[ModelCheckpoint(dirpath=stage3, save_last=True)])  # fmt: skip
    saved = stage3 / "last.ckpt" / "pytorch_model.bin"
    report["zero3"] = {"weights": weights(module), "global_step": trainer.global_step,
                       "partitioned": sum(p.numel() for p in module.parameters()),  # ZeRO-3: this rank's share
                       "saved_weights": torch.load(saved, weights_only=True) if saved.exists() else None}  # fmt: skip
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--job", required=True, choices=("strategies", "world1", "deepspeed"))
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)  # a hang fails with a traceback
    out = Path(args.out)
    if args.job == "strategies":
        report = strategies_job(out)
    elif args.job == "world1":
        report = world1_job(args.resume)
    else:
        report = deepspeed_job(out)
    torch.save(report, out / f"rank{report['rank']}.pt")


if __name__ == "__main__":
    main()
