"""Every example runs, offline on the CPU, with a tiny setting (the defaults are sized for a demo run)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd: Path, timeout: int = 240) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{name} {args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra", [[], ["--precision", "bf16-mixed"], ["--devices", "2", "--strategy", "ddp"]],
                         ids=["single", "bf16", "ddp"])  # fmt: skip
def test_digits(tmp_path, extra):
    out = run_example("digits.py", "--max-epochs", "2", "--root-dir", str(tmp_path), *extra, cwd=tmp_path)
    accuracy = float(re.search(r"final validation accuracy: ([0-9.]+)", out).group(1))
    assert accuracy > 0.5  # two epochs; the full demo reaches > 0.95


@pytest.mark.timeout(300)
def test_char_lm_with_accumulation_bf16_and_exact_resume(tmp_path):
    tiny = ["--width", "16", "--context", "16", "--batch-size", "8", "--accumulate", "2", "--precision", "bf16-mixed",
            "--root-dir", str(tmp_path)]  # fmt: skip
    first = run_example("char_lm.py", *tiny, "--max-steps", "4", cwd=tmp_path)
    assert "final validation loss" in first
    resumed = run_example("char_lm.py", *tiny, "--max-steps", "8", "--resume", cwd=tmp_path)
    assert "final validation loss" in resumed
    checkpoints = sorted(p.name for p in tmp_path.glob("logs/version_*/checkpoints/*.ckpt"))
    assert any("step=8" in name for name in checkpoints), checkpoints  # continued from step 4 to step 8


@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra", [["--accumulate", "2", "--precision", "bf16-mixed"], ["--devices", "2"]],
                         ids=["bf16-accumulate", "two-processes"])  # fmt: skip
def test_engine_loop(tmp_path, extra):
    """The digits example as a hand-written loop; with --devices 2 the Engine starts the second process."""
    out = run_example("engine_loop.py", "--accelerator", "cpu", "--max-epochs", "3", "--root-dir", str(tmp_path),
                      *extra, cwd=tmp_path)  # fmt: skip
    [accuracy] = re.findall(r"final validation accuracy: ([0-9.]+)", out)  # printed once: by rank 0
    assert float(accuracy) > 0.6  # three epochs; chance is 0.1
    [metrics] = tmp_path.glob("digits/version_*/metrics.csv")
    assert "val_acc" in metrics.read_text().splitlines()[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device_map", ["split", "auto"])
def test_model_parallel(tmp_path, device_map):
    out = run_example("model_parallel.py", "--max-epochs", "1", "--width", "16", "--device-map", device_map,
                      "--root-dir", str(tmp_path), cwd=tmp_path)  # fmt: skip
    assert "final validation token accuracy" in out
    assert "placement: encoder on device 0 (cpu), decoder on device 1 (cpu)" in out


@pytest.mark.timeout(300)
def test_char_lm_fsdp_on_two_processes(tmp_path):
    out = run_example("char_lm.py", "--width", "16", "--context", "16", "--batch-size", "8", "--max-steps", "4",
                      "--devices", "2", "--strategy", "fsdp", "--root-dir", str(tmp_path), cwd=tmp_path)  # fmt: skip
    assert "final validation loss" in out
    assert list(tmp_path.glob("logs/version_0/checkpoints/*")), "the sharded checkpoint folder was not written"
