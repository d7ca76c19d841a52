"""One fit, run by every cluster path the tests compare (``trainer run``, Ray's TorchTrainer, Kubeflow's pods).

``python cluster_fit.py OUT [--steps N] [--strategy S] [--every K] [--devices D] [--num-nodes N]`` trains a tiny
regressor, saving a checkpoint every K steps, and every rank writes its final weights to ``OUT/<strategy>/weights-rank<R>.pt`` (global rank 0 also to
``weights.pt``) (``--strategy ddp,fsdp``: one fit each).
:func:`fit` is the same fit as a function (Ray's ``train_loop_per_worker``); ``fail_at`` raises on global rank 1
at that step on the first attempt (no checkpoint from Ray yet), as a crashed worker would; ``ray_data`` adds a DDP fit
on this worker's shard of the Ray Dataset ``"train"`` (``OUT/ray_data``).
"""
import argparse
import sys
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for helpers
from helpers import Regressor, regression_data  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.callbacks import Callback, ModelCheckpoint  # noqa: E402


class FailOnce(Callback):
    """Raises on global rank 1 after optimizer step ``step`` of a first attempt (Ray holds no checkpoint yet)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        import ray.train

        if trainer.global_step == self.step and trainer.global_rank == 1 and ray.train.get_checkpoint() is None:
            raise RuntimeError(f"worker failure injected at step {self.step}")


def strategy_of(name: str) -> Any:
    """A strategy name, or for the layouts that need sizes, the strategy for 2 ranks (``nd_parallel``: FSDP2 over
    both; ``deepspeed``: ZeRO stage 2)."""
    if name == "nd_parallel":
        from trainer.strategies import NDParallelStrategy

        return NDParallelStrategy(dp_shard=2)
    if name == "deepspeed":
        from trainer.strategies.data_parallel.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(stage=2)
    return name


def fit(config: dict[str, Any]) -> None:
    """Train once per strategy of ``config["strategy"]`` (comma-separated), into ``out/<strategy>``; ``config``
    also holds steps, every (checkpoint interval), devices, num_nodes, fail_at."""
    for name in config.get("strategy", "ddp").split(","):
        fit_one({**config, "strategy": name, "out": str(Path(config["out"]) / name)})
    if config.get("ray_data"):
        fit_one({**config, "strategy": "ddp", "out": str(Path(config["out"]) / "ray_data"), "fail_at": None})


class RayShard:
    """This worker's shard of the Ray Dataset ``"train"`` as ``(x, y, ids)`` batches (iterated anew each epoch)."""

    def __iter__(self):
        import ray.train

        for batch in ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=4):
            yield batch["x"].float(), batch["y"].float().unsqueeze(1), batch["id"]


class IdRegressor(Regressor):
    """The regressor on ``(x, y, ids)`` batches."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch[:2], batch_idx)


class SeenIds(Callback):
    """Records the sample ids this rank trained on (the third element of a Ray Data batch)."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.ids.extend(int(i) for i in batch[2])


def fit_one(config: dict[str, Any]) -> None:
    """One fit with one strategy, into ``config["out"]``."""
    torch.set_num_threads(1)
    out = Path(config["out"])
    torch.manual_seed(0)
    ray_data = config["out"].endswith("ray_data")
    model = IdRegressor() if ray_data else Regressor()
    data = RayShard() if ray_data else DataLoader(regression_data(n=64), batch_size=4, shuffle=True,
                                                   generator=torch.Generator().manual_seed(1))  # fmt: skip
    callbacks: list = [ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=config.get("every", 5),
                                       save_top_k=-1)]  # fmt: skip
    seen = SeenIds()
    if ray_data:
        callbacks.append(seen)
    if config.get("fail_at") is not None:
        callbacks.append(FailOnce(config["fail_at"]))
    placement = {key: config[key] for key in ("devices", "num_nodes") if config.get(key) is not None}
    trainer = Trainer(accelerator="cpu", strategy=strategy_of(config.get("strategy", "ddp")), max_steps=config.get("steps", 16),
                      logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=out,
                      callbacks=callbacks, **placement)  # fmt: skip
    trainer.fit(model, data)
    # every rank gathers (a collective under FSDP, whose parameters are DTensor shards)
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in model.state_dict().items()}  # fmt: skip
    report = {"state_dict": state, "world_size": trainer.world_size, "global_step": trainer.global_step,
              "environment": type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
              "ranks": (trainer.global_rank, trainer.local_rank, trainer.node_rank), "seen_ids": seen.ids}  # fmt: skip
    torch.save(report, out / f"weights-rank{trainer.global_rank}.pt")
    if trainer.is_global_zero:
        torch.save(report, out / "weights.pt")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--num-nodes", type=int, default=None)
    parser.add_argument("--fail-at", type=int, default=None, help="under Ray: rank 1 raises at this step, first attempt")
    args = parser.parse_args(argv)
    fit(dict(out=args.out, steps=args.steps, strategy=args.strategy, every=args.every, devices=args.devices, fail_at=args.fail_at,
             num_nodes=args.num_nodes))  # fmt: skip


if __name__ == "__main__":
    main()
