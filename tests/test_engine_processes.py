"""The Engine across real processes (gloo on the CPU), started the way users start them: a plain
``python script.py`` whose ``Engine(devices=2)`` starts rank 1 itself (see tests/scripts/engine_job.py).

The jobs start when the module does (two at a time; most of their time is interpreter start-up); each test
checks one outcome. Every process is bounded by a timeout and dumps its stacks if it hangs.
"""
from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_ddp_processes import clean_env

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "scripts" / "engine_job.py"
TIMEOUT_S = 150
KILLED = 3  # engine_job.py's exit status after save_state

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(3 * TIMEOUT_S),
]


def run(command: list[str], cwd: Path) -> tuple[int, str]:
    """Run to the end of its output (every rank it started has exited); a hang kills the session and fails."""
    proc = subprocess.Popen(command, cwd=cwd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{command} did not finish in {TIMEOUT_S}s:\n{output[-6000:]}") from None
    return proc.returncode, output


def reports(out: Path) -> list[dict]:
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    tmp = tmp_path_factory.mktemp("engine_jobs")
    folders = {name: tmp / name for name in ("parity", "killed", "resumed")}
    for folder in folders.values():
        folder.mkdir()
    state = folders["killed"] / "state"
    commands = {
        "parity": [sys.executable, str(JOB), str(folders["parity"]), "parity"],
        "killed": [sys.executable, str(JOB), str(folders["killed"]), "killed", str(state)],
        "resumed": [sys.executable, str(JOB), str(folders["resumed"]), "resumed", str(state)],
    }
    results: dict[str, tuple[int, str, Path]] = {}

    def start(name: str) -> None:
        results[name] = (*run(commands[name], folders[name]), folders[name])

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = [pool.submit(start, name) for name in ("parity", "killed")]
        concurrent.futures.wait(first)
        later = [pool.submit(start, "resumed")]
        concurrent.futures.wait(later)
    for future in first + later:
        future.result()
    return results


def ok(jobs: dict, name: str) -> list[dict]:
    code, output, folder = jobs[name]
    assert code == 0, output[-8000:]
    return reports(folder)


def test_engine_loop_equals_the_trainer_and_one_process_with_the_global_batch(jobs):
    """2 ranks, gloo, 16-mixed on the CPU (inf gradients skip the first steps), accumulation 2 with a partial
    last window, clipping, SGD with momentum, a step LR scheduler, a shuffled loader."""
    rank0, rank1 = ok(jobs, "parity")
    engine, trainer, single = rank0["engine"], rank0["trainer"], rank0["one_process"]
    for name, value in engine["weights"].items():
        assert torch.equal(value, trainer[name]), f"{name}: the Engine and the Trainer differ"
        assert torch.equal(value, rank1["engine"]["weights"][name]), f"{name}: the ranks differ"
        torch.testing.assert_close(value, single[name], rtol=0, atol=5e-5, msg=f"{name}: one process differs")
    assert engine["syncs"] == [False, True, False, True, False, True, True] * 2
    assert engine["sampler"] == "DistributedSampler"
    assert any(n != n for n in engine["norms"]) and engine["norms"][-1] < 1e3  # skipped fp16 steps, true norms after
    assert engine["lr"] == 0.1 * 0.5**3  # 8 windows, 2 skipped: the scheduler stepped 6 times


def test_collectives_and_rank_zero_io_on_two_ranks(jobs):
    rank0, rank1 = ok(jobs, "parity")
    code, output, folder = jobs["parity"]
    for report in (rank0, rank1):
        assert report["gather"].tolist() == [0, 0, 1, 1]
        assert report["gather_scalar"].tolist() == [0.0, 1.0]
        assert report["gather_nested"]["a"][0].tolist() == [0, 1]
        assert float(report["reduce_sum"]) == 3.0 and float(report["reduce_mean"]) == 1.5
        assert report["broadcast"] == {"from": 1}
        assert report["device"] == "cpu"
    assert rank0["ranks"] == (2, 0, 0, True, True) and rank1["ranks"] == (2, 1, 1, False, False)
    assert (folder / "saved_by_0.pt").exists() and not (folder / "saved_by_1.pt").exists()
    assert output.count("printed by rank") == 1 and "printed by rank 0" in output
    [run_folder] = (folder / "proj").iterdir()
    assert (run_folder / "metrics.csv").read_text().splitlines() == ["step,value", "1,1.0"]  # rank 0's value only
    assert "lr: 0.1" in (run_folder / "hparams.yaml").read_text()


def test_a_loop_killed_after_save_state_mid_epoch_resumes_bitwise_equal(jobs):
    """Killed inside an accumulation window of epoch 1 (dropout, Adam, StepLR, shuffled data, 16-mixed); a new
    job with other initial weights and RNG loads the state and ends with the uninterrupted run's weights."""
    code, output, folder = jobs["killed"]
    assert code == KILLED, output[-8000:]
    assert sorted(p.name for p in (folder / "state").iterdir()) == ["engine_state.pt", "rank_0.pt", "rank_1.pt"]
    resumed = ok(jobs, "resumed")
    uninterrupted = ok(jobs, "parity")
    for rank in (0, 1):
        expected, actual = uninterrupted[rank]["uninterrupted"], resumed[rank]["resumed"]
        assert actual["batches"] == expected["batches"] == 14
        assert actual["lr"] == expected["lr"]
        different = [k for k in expected["weights"] if not torch.equal(expected["weights"][k], actual["weights"][k])]
        assert not different, f"rank {rank}: parameters differ after resume: {different}"

