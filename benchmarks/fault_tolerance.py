"""Fault tolerance (``ft_ddp``, torchft) against plain ``ddp``: what it costs per step, and what a failure costs.

1. Per-step cost: the same fit (an MLP 256-1024-1024-10, batch 64, one process, gloo) as ``ddp`` and as ``ft_ddp``
   with one healthy replica group and a lighthouse on this machine; interleaved rounds, medians of the step times
   after a warm-up. ``ft_ddp`` adds a quorum (a round trip to the lighthouse) and a second all-reduce per bucket.
2. Time lost to one failure, measured from the SIGKILL to the moment the job is back at the step it was at:
   restart-free (two ``ft_ddp`` groups, one killed: the survivor's extra time) against restart-from-checkpoint
   (one ``ddp`` job killed and started again at once with ``ckpt_path="last"``, checkpoints every ``--every``
   steps: process start, reading the checkpoint, and the steps since it).

``python benchmarks/fault_tolerance.py [--rounds 3] [--steps 200] [--every 50]``; prints the figures and ratios.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
LIGHTHOUSE = Path(sys.executable).parent / "torchft_lighthouse"


# ---------------------------------------------------------------------------------------------- the worker
def worker(args: argparse.Namespace) -> None:
    """One job (or replica group): fits and appends ``step time`` to ``OUT/steps-<id>.txt`` after every step."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Callback, Trainer, TrainModule
    from trainer.callbacks import ModelCheckpoint

    torch.set_num_threads(1)
    out = Path(args.out)
    replica = os.environ.get("REPLICA_GROUP_ID", "0")

    class MLP(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                     nn.Linear(1024, 10))  # fmt: skip

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Record(Callback):
        def __init__(self) -> None:
            self.file = open(out / f"steps-{replica}.txt", "a", buffering=1)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.file.write(f"{trainer.global_step} {time.time():.6f}\n")

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64 * 64, 256, generator=g), torch.randint(0, 10, (64 * 64,), generator=g))
    callbacks: list = [Record()]
    if args.every:
        callbacks.append(ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=args.every, save_last=True))
    strategy = args.strategy
    if strategy == "ft_ddp":
        from trainer.strategies.data_parallel.fault_tolerant import FaultTolerantStrategy

        strategy = FaultTolerantStrategy(ft_timeout=5, quorum_timeout=60, connect_timeout=10)
    trainer = Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=args.steps, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(args.every),
                      callbacks=callbacks, default_root_dir=out, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(MLP(), DataLoader(data, batch_size=64, shuffle=True), ckpt_path="last" if args.resume else None)


# ---------------------------------------------------------------------------------------------- the driver
def _start(out: Path, strategy: str, steps: int, replica: int = 0, groups: int = 1, lighthouse: int = 0,
           every: int = 0, resume: bool = False) -> subprocess.Popen:  # fmt: skip
    from trainer.strategies.launch.environments.local import find_free_port

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(find_free_port()), REPLICA_GROUP_ID=str(replica), NUM_REPLICA_GROUPS=str(groups),
               TORCHFT_LIGHTHOUSE=f"localhost:{lighthouse}")  # fmt: skip
    command = [sys.executable, str(HERE), "--worker", "--out", str(out), "--strategy", strategy, "--steps", str(steps),
               "--every", str(every)] + (["--resume"] if resume else [])  # fmt: skip
    log = open(out / f"log-{replica}-{time.time_ns()}.txt", "w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _lighthouse(out: Path) -> tuple[subprocess.Popen, int]:
    from trainer.strategies.launch.environments.local import find_free_port

    port = find_free_port()
    log = open(out / "lighthouse.txt", "w")
    command = [str(LIGHTHOUSE), "--min_replicas", "1", "--join_timeout_ms", "500", "--quorum_tick_ms", "50",
               "--heartbeat_timeout_ms", "1000", "--bind", f"[::]:{port}"]  # fmt: skip
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), port


def _steps(out: Path, replica: int = 0) -> list[tuple[int, float]]:
    path = out / f"steps-{replica}.txt"
    if not path.exists():
        return []
    return [(int(s), float(t)) for s, t in (line.split() for line in path.read_text().splitlines() if line)]


def _wait(process: subprocess.Popen, what: str, timeout: float = 600) -> None:
    if process.wait(timeout=timeout) != 0:
        raise SystemExit(f"{what} failed with exit status {process.returncode}")


def _step_time(out: Path, warmup: int) -> float:
    times = [t for _, t in _steps(out)][warmup:]
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def per_step_cost(rounds: int, steps: int) -> tuple[float, float]:
    """Median step time of ``ddp`` and of ``ft_ddp`` (one healthy group), interleaved rounds."""
    ddp, ft = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            _wait(_start(Path(a), "ddp", steps), "ddp")
            ddp.append(_step_time(Path(a), 20))
            lighthouse, port = _lighthouse(Path(b))
            try:
                _wait(_start(Path(b), "ft_ddp", steps, lighthouse=port), "ft_ddp")
            finally:
                os.killpg(lighthouse.pid, signal.SIGKILL)
            ft.append(_step_time(Path(b), 20))
    return statistics.median(ddp), statistics.median(ft)


def _wait_for(out: Path, step: int, replica: int = 0, timeout: float = 300) -> float:
    """The time ``replica`` recorded ``step`` (waits for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s, t in reversed(_steps(out, replica)):
            if s >= step:
                return t
        time.sleep(0.01)
    raise SystemExit(f"step {step} not reached in {timeout:.0f} s")


def _kill(process: subprocess.Popen) -> float:
    os.killpg(process.pid, signal.SIGKILL)
    killed = time.time()
    process.wait()
    return killed


def lost_restart_free(steps: int, kill_at: int) -> tuple[float, float]:
    """Two groups; group 1 killed at ``kill_at``: the survivor's extra time to get one step further, and its step."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        lighthouse, port = _lighthouse(out)
        try:
            survivor = _start(out, "ft_ddp", steps, 0, 2, port)
            victim = _start(out, "ft_ddp", steps, 1, 2, port)
            _wait_for(out, kill_at, 1)
            killed = _kill(victim)
            at_kill = max(s for s, t in _steps(out, 0) if t <= killed)
            back = _wait_for(out, at_kill + 2, 0)  # the dropped step, then one more
            step = _step_time(out, 20)
            _kill(survivor)
        finally:
            os.killpg(lighthouse.pid, signal.SIGKILL)
    return back - killed - 2 * step, step


def lost_restart_from_checkpoint(steps: int, kill_at: int, every: int) -> tuple[float, float]:
    """One ``ddp`` job killed at ``kill_at`` and restarted at once from its last checkpoint: the time until it is back
    at the step it was at, beyond what that step would have taken."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        job = _start(out, "ddp", steps, every=every)
        _wait_for(out, kill_at)
        killed = _kill(job)
        at_kill = max(s for s, t in _steps(out) if t <= killed)
        step = _step_time(out, 20)
        restarted = _start(out, "ddp", steps, every=every, resume=True)
        back = _wait_for(out, at_kill + 1)
        _kill(restarted)
    return back - killed - step, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50, help="checkpoint interval of the restart-based job")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if not LIGHTHOUSE.exists():
        raise SystemExit("torchft is not installed (no torchft_lighthouse next to this Python): pip install the ft extra")
    ddp, ft = per_step_cost(args.rounds, args.steps)
    print(f"per step, one healthy group: ddp {ddp * 1e3:.2f} ms, ft_ddp {ft * 1e3:.2f} ms -> {ft / ddp:.3f}x")
    kill_at = args.every + args.every // 2 + 20  # halfway between two checkpoints
    steps = kill_at + 3 * args.every
    free, free_step = lost_restart_free(steps, kill_at)
    restart, restart_step = lost_restart_from_checkpoint(steps, kill_at, args.every)
    print(f"time lost to one failure at step {kill_at} (checkpoints every {args.every} steps): restart-free "
          f"{free:.2f} s ({free / free_step:.0f} steps of {free_step * 1e3:.1f} ms), restart from checkpoint "
          f"{restart:.2f} s ({restart / restart_step:.0f} steps of {restart_step * 1e3:.1f} ms) -> restart-based "
          f"loses {restart / free:.1f}x as much")  # fmt: skip


if __name__ == "__main__":
    main()
