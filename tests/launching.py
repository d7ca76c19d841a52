"""Helpers for the tests that launch real training processes (trainer run, sbatch): one reference result.

The reference is ``scripts/train.py`` run by ``trainer run --devices 2`` (two processes, torchrun, no
SLURM); it is computed once per test session and every launch path must end with the same weights.
"""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

SCRIPTS = Path(__file__).parent / "scripts"
TRAIN = SCRIPTS / "train.py"
STEPS = 12  # crosses an epoch boundary: 64 samples, batch 4, two ranks


def trainer_command(*args: str) -> list[str]:
    """``python -m trainer ARGS`` with this interpreter."""
    return [sys.executable, "-m", "trainer", *args]


def start(command: list[str], env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None) -> subprocess.Popen:
    """Start ``command`` in its own session (so :func:`finish` can end it with every process it started)."""
    environment = dict(os.environ if env is None else env, OMP_NUM_THREADS="1")
    return subprocess.Popen(command, env=environment, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


def finish(process: subprocess.Popen, timeout: float = 180, expect: int = 0) -> str:
    """Wait for ``process``; on a hang kill its whole session and fail. Returns the output, raising unless the
    exit status is ``expect``."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: torchrun's agent then stops its workers, which run in sessions of their own.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate(timeout=30)
        raise AssertionError(f"{' '.join(process.args)} did not finish within {timeout:.0f}s:\n{output}") from None
    if process.returncode != expect:
        raise AssertionError(f"{' '.join(process.args)} exited with {process.returncode}:\n{output}")
    return output


def run(command: list[str], timeout: float = 180, env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None) -> str:
    """Run to completion (a hang fails the test); returns the output, raising with it on failure."""
    return finish(start(command, env, cwd), timeout)


def load_weights(path: Path) -> dict:
    """What ``scripts/train.py`` saved."""
    return torch.load(path, weights_only=True)


@functools.lru_cache(maxsize=None)
def reference() -> dict:
    """Weights after STEPS steps of a 2-process ``trainer run`` (cached for the session)."""
    out = Path(tempfile.mkdtemp(prefix="reference-"))
    run(trainer_command("run", "--devices", "2", str(TRAIN), str(out), "--steps", str(STEPS)), cwd=out)
    return load_weights(out / "weights-0.pt")


def assert_same_weights(result: dict, expected: dict) -> None:
    """Same world size and step, and equal weights (the runs are deterministic on the CPU)."""
    assert (result["world_size"], result["global_step"]) == (expected["world_size"], expected["global_step"])
    for name, value in expected["state_dict"].items():
        torch.testing.assert_close(result["state_dict"][name], value, rtol=0, atol=1e-6, msg=name)
