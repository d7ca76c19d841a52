"""Runs that share a ``default_root_dir`` never touch each other's files: each claims its own ``version_N``
folder atomically, and a checkpoint writer only removes temporaries that are its own or whose process is dead."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from trainer.strategies.checkpoint.checkpoint_io import atomic_save
from trainer.loggers.run_folder import RunFolder

SCRIPT = Path(__file__).parent / "scripts" / "shared_root_fit.py"


@pytest.mark.timeout(240)
def test_two_fits_started_at_once_on_one_root_keep_all_their_files(tmp_path: Path) -> None:
    root, go = tmp_path / "runs", tmp_path / "go"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = {lr: subprocess.Popen([sys.executable, str(SCRIPT), str(root), str(go), str(lr)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for lr in (0.01, 0.02)}  # fmt: skip
    time.sleep(3)  # both are past their imports and waiting
    go.touch()
    outputs = {lr: proc.communicate(timeout=200)[0] for lr, proc in procs.items()}
    for lr, proc in procs.items():
        assert proc.returncode == 0, outputs[lr]
    log_dirs = {lr: Path(out.split("LOG_DIR=")[1].split()[0]) for lr, out in outputs.items()}
    assert log_dirs[0.01] != log_dirs[0.02]
    assert sorted(p.name for p in (root / "logs").iterdir()) == ["version_0", "version_1"]
    for lr, log_dir in log_dirs.items():
        assert yaml.safe_load((log_dir / "hparams.yaml").read_text())["lr"] == lr  # each run's own, whole
        assert list(log_dir.glob("events.out.tfevents.*")) or (log_dir / "metrics.csv").exists()
        checkpoints = sorted(p.name for p in (log_dir / "checkpoints").iterdir())
        assert checkpoints == sorted([f"epoch={(s - 1) // 4}-step={s}.ckpt" for s in range(1, 13)] + ["last.ckpt"])
        saved = torch.load(log_dir / "checkpoints" / "last.ckpt", weights_only=True)
        assert saved["global_step"] == 12 and saved["hyper_parameters"]["lr"] == lr


def test_a_version_folder_is_claimed_by_creating_it(tmp_path: Path) -> None:
    first, second = RunFolder(tmp_path, "logs", None), RunFolder(tmp_path, "logs", None)
    assert (first.version, second.version) == (0, 1)  # the first claimed version_0 although it wrote nothing yet
    assert (tmp_path / "logs" / "version_0").is_dir() and (tmp_path / "logs" / "version_1").is_dir()


def test_a_save_leaves_another_live_process_temporary_alone(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
        in_flight = tmp_path / f".last.ckpt.tmp-{other.pid}"  # another run writing the same name right now
        killed = tmp_path / f".last.ckpt.tmp-{dead}"  # a writer killed mid-save
        own = tmp_path / f".last.ckpt.tmp-{os.getpid()}-old"  # not a temporary name of ours: left alone
        for path in (in_flight, killed, own):
            path.write_bytes(b"partial")
        atomic_save({"x": 1}, tmp_path / "last.ckpt")
        assert in_flight.exists() and not killed.exists() and own.exists()
        assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"x": 1}
    finally:
        other.kill()
        other.wait()
