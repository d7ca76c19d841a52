"""Step time of the same 2-worker DDP job under Ray Train and under torchrun (``trainer run --devices 2``).

    python benchmarks/ray_vs_torchrun.py [--steps 300] [--repeats 2] [--width 256]

One local Ray cluster (``ray.init(num_cpus=2)``) is started once; then, interleaved ``--repeats`` times, the job
(an MLP of ``--width``, batch 64, gloo, 1 thread per worker) runs under torchrun and under Ray's ``TorchTrainer``.
Each run times its steps after a 20-step warm-up (rank 0, ``time.perf_counter`` around the steps); start-up is not
counted. Prints the median step time of each side and the ratio Ray / torchrun.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 20


def fit(config: dict) -> None:
    """The job: both launchers run this (torchrun through ``__main__``, Ray as ``train_loop_per_worker``)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Trainer, TrainModule
    from trainer.callbacks import Callback

    torch.set_num_threads(1)
    width, steps = config["width"], config["steps"]

    class MLP(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == WARMUP:
                self.start = time.perf_counter()

        def on_train_end(self, trainer, module):
            if trainer.is_global_zero:
                per_step = (time.perf_counter() - self.start) / (trainer.global_step - WARMUP)
                Path(config["out"]).write_text(json.dumps({"step_s": per_step}))

    torch.manual_seed(0)
    x = torch.randn(64 * 50, width)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64, shuffle=True)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps + WARMUP, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[Clock()])  # fmt: skip
    trainer.fit(MLP(), data)


def under_torchrun(config: dict) -> float:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "trainer", "run", "--devices", "2", __file__, "--worker", json.dumps(config)],
                   check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    return json.loads(Path(config["out"]).read_text())["step_s"]


def under_ray(config: dict) -> float:
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    TorchTrainer(fit, train_loop_config=config, torch_config=TorchConfig(backend="gloo"),
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})).fit()  # fmt: skip
    return json.loads(Path(config["out"]).read_text())["step_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        fit(json.loads(args.worker))
        return
    import ray

    root = Path(__file__).resolve().parents[1]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    os.environ["OMP_NUM_THREADS"] = "1"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    folder = Path(tempfile.mkdtemp(prefix="ray-vs-torchrun-"))
    sides: dict[str, list[float]] = {"torchrun": [], "ray": []}
    try:
        for repeat in range(args.repeats):
            for name, run in (("torchrun", under_torchrun), ("ray", under_ray)):
                config = {"width": args.width, "steps": args.steps, "out": str(folder / f"{name}-{repeat}.json")}
                sides[name].append(run(config))
                print(f"repeat {repeat}: {name:8s} {sides[name][-1] * 1e3:.3f} ms/step", flush=True)
    finally:
        ray.shutdown()
    torchrun, on_ray = statistics.median(sides["torchrun"]), statistics.median(sides["ray"])
    print(f"median step: torchrun {torchrun * 1e3:.3f} ms, Ray Train {on_ray * 1e3:.3f} ms, "
          f"ratio Ray/torchrun {on_ray / torchrun:.3f}x ({args.steps} steps, width {args.width}, 2 gloo workers)")


if __name__ == "__main__":
    main()
