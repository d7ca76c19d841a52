"""Exact resume across real process deaths: a fit killed at any point and resumed with ckpt_path="last" ends
with the same weights, bit for bit, as the fit that was never stopped (shuffled loaders, dropout, Adam,
StepLR, gradient accumulation, validation inside epochs: see tests/scripts/resumable_fit.py).

The runs that die are real subprocesses; the uninterrupted and the resumed runs execute the same script in
this process (same code, same seeds, one thread), which keeps the suite fast.
"""
from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "resumable_fit.py"
KILLED = 3  # the script's os._exit status


def run_fit(root: Path, out: Path, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(root), str(out), *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == expect, proc.stderr[-3000:]
    return proc


def run_here(root: Path, out: Path, *args: str) -> None:
    spec = importlib.util.spec_from_file_location("resumable_fit", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([str(root), str(out), *args])


def assert_same_weights(expected: Path, actual: Path) -> None:
    a, b = torch.load(expected, weights_only=True), torch.load(actual, weights_only=True)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ after resume: {different}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("uninterrupted")
    run_here(root, root / "weights.pt")
    return root / "weights.pt"


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(["--kill-batch", "14"], id="mid-epoch-and-mid-accumulation-window"),
        pytest.param(["--kill-val", "5"], id="during-validation"),
        pytest.param(["--kill-batch", "17", "--save-every-batch"], id="checkpoint-inside-accumulation-window"),
    ],
)
def test_killed_fit_resumes_bitwise_equal(reference: Path, tmp_path: Path, kill: list[str]) -> None:
    run_fit(tmp_path, tmp_path / "weights.pt", *kill, expect=KILLED)
    assert not (tmp_path / "weights.pt").exists()
    run_here(tmp_path, tmp_path / "weights.pt", "--resume")
    assert_same_weights(reference, tmp_path / "weights.pt")


def test_sigterm_saves_exits_cleanly_and_resumes_equal(reference: Path, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    out = tmp_path / "weights.pt"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path), str(out), "--sleep", "0.05",
                             "--ready-after", "12", "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert not out.exists(), "the process went on after the signal instead of exiting"
    saved = torch.load(tmp_path / "checkpoints" / "interrupted.ckpt", weights_only=True)
    assert 4 <= saved["global_step"] < 10  # it stopped soon after the signal, at an optimizer-step boundary
    assert saved["loops"]["fit"]["total_batches"] % 3 in (0, 1)  # windows of 3 micro-batches (10 per epoch)
    run_here(tmp_path, out, "--resume")
    assert_same_weights(reference, out)


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    script = SCRIPT.parent / "two_rank_signal.py"
    ready = tmp_path / "ready"
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path / "init"), str(tmp_path),
                               str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, [p.communicate() for p in procs]
            time.sleep(0.01)
        procs[1].send_signal(signal.SIGTERM)  # only rank 1 is told
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    steps = {out.strip() for out, _ in outputs}
    saved = torch.load(tmp_path / "checkpoints" / "interrupted.ckpt", weights_only=True)["global_step"]
    assert steps == {f"rank 0 stopped at step {saved}", f"rank 1 stopped at step {saved}"}
    assert saved < 1000  # long before the 2000 batches were done


SLOW_SAVE = r"""
import os, sys, torch
sys.path.insert(0, sys.argv[2])
from trainer.strategies.checkpoint.checkpoint_io import atomic_save
path = sys.argv[1]
atomic_save({"global_step": 1, "state_dict": {"w": torch.zeros(4)}}, path)
print("first saved", flush=True)
big = {"global_step": 2, "state_dict": {f"w{i}": torch.ones(1_000_000) for i in range(64)}}  # 256 MB
atomic_save(big, path)
print("second saved", flush=True)
"""


def test_sigkill_during_a_large_save_leaves_the_previous_last_ckpt_loadable(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(target), str(SCRIPT.parents[2])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline() == "first saved\n", proc.communicate()
        deadline = time.monotonic() + 90
        partial = []
        while not partial:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            partial = [p for p in tmp_path.iterdir() if p.name.startswith(".last.ckpt.tmp-") and p.stat().st_size]
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    from trainer.strategies.checkpoint.checkpoint_io import atomic_save, safe_load

    assert safe_load(target)["global_step"] == 1  # the previous checkpoint, complete
    assert partial[0].exists()  # the killed write was in progress
    atomic_save({"global_step": 3}, target)  # the next save cleans up what the killed writer left
    assert safe_load(target)["global_step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ddp-uninterrupted")
    run_fit(root, root / "weights.pt", "--devices", "2")
    return root / "weights.pt"


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(["--kill-batch", "7"], id="ddp-mid-epoch"),
        pytest.param(["--kill-batch", "8", "--save-every-batch"], id="ddp-inside-accumulation-window"),
    ],
)
def test_killed_ddp_fit_resumes_bitwise_equal(ddp_reference: Path, tmp_path: Path, kill: list[str]) -> None:
    """Two DDP ranks (shuffled DistributedSampler) killed mid-epoch resume to the uninterrupted weights."""
    run_fit(tmp_path, tmp_path / "weights.pt", "--devices", "2", *kill, expect=KILLED)
    run_fit(tmp_path, tmp_path / "weights.pt", "--devices", "2", "--resume")
    assert_same_weights(ddp_reference, tmp_path / "weights.pt")
