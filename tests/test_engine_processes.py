"""The Engine across real processes (gloo on the CPU), started the way users start them: a plain
``python script.py`` whose ``Engine(devices=2)`` starts rank 1 itself (see tests/scripts/engine_job.py).

The jobs start when the module does (two at a time; most of their time is interpreter start-up); each test
checks one outcome. Every process is bounded by a timeout and dumps its stacks if it hangs.
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from launching import finish, start
from test_ddp_processes import clean_env

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "scripts" / "engine_job.py"
TIMEOUT_S = 150
KILLED = 3  # engine_job.py's exit status after save_state

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(3 * TIMEOUT_S),
]


def run(command: list[str], cwd: Path, expect: int = 0) -> str:
    """Run to the end of its output (every rank it started has exited); a hang or another exit status fails."""
    return finish(start(command, clean_env(), cwd), TIMEOUT_S, expect)


def reports(out: Path) -> list[dict]:
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]


EXPECTED_STATUS = {"parity": 0, "killed": KILLED, "resumed": 0}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[Path, str, Optional[AssertionError]]]:
    tmp = tmp_path_factory.mktemp("engine_jobs")
    folders = {name: tmp / name for name in EXPECTED_STATUS}
    for folder in folders.values():
        folder.mkdir()
    state = folders["killed"] / "state"
    commands = {
        "parity": [sys.executable, str(JOB), str(folders["parity"]), "parity"],
        "killed": [sys.executable, str(JOB), str(folders["killed"]), "killed", str(state)],
        "resumed": [sys.executable, str(JOB), str(folders["resumed"]), "resumed", str(state)],
    }
    results: dict[str, tuple[Path, str, Optional[AssertionError]]] = {}

    def launch(name: str) -> None:
        try:
            results[name] = (folders[name], run(commands[name], folders[name], EXPECTED_STATUS[name]), None)
        except AssertionError as failure:  # reported by the tests that need this job
            results[name] = (folders[name], "", failure)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(launch, ("parity", "killed")))
    launch("resumed")
    return results


def job(jobs: dict, name: str) -> tuple[Path, str]:
    """The job's folder and output; fails with the job's own failure."""
    folder, output, failure = jobs[name]
    if failure is not None:
        raise failure
    return folder, output


def test_engine_loop_equals_the_trainer_and_one_process_with_the_global_batch(jobs):
    """2 ranks, gloo, 16-mixed on the CPU (inf gradients skip the first steps), accumulation 2 with a partial
    last window, clipping, SGD with momentum, a step LR scheduler, a shuffled loader."""
    rank0, rank1 = reports(job(jobs, "parity")[0])
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
    folder, output = job(jobs, "parity")
    rank0, rank1 = reports(folder)
    for report in (rank0, rank1):
        assert report["gather"].tolist() == [0, 0, 1, 1]
        assert report["gather_scalar"].tolist() == [0.0, 1.0]
        assert report["gather_nested"]["a"][0].tolist() == [0, 1]
        assert float(report["reduce_sum"]) == 3.0 and float(report["reduce_mean"]) == 1.5
        assert report["broadcast"] == {"from": 1}
        assert report["device"] == "cpu"
        assert sorted(report["gather_epoch"].tolist()) == [0, 0, 1, 2, 3, 4, 5, 6]  # the sampler's repeat
        index, label = report["gather_for_metrics_epoch"]
        assert index.tolist() == [0, 2, 1, 3, 4, 6, 5] and label.tolist() == [10 * i for i in index.tolist()]
    assert rank0["ranks"] == (2, 0, 0, True, True) and rank1["ranks"] == (2, 1, 1, False, False)
    assert (folder / "saved_by_0.pt").exists() and not (folder / "saved_by_1.pt").exists()
    assert output.count("printed by rank") == 1 and "printed by rank 0" in output
    [run_folder] = (folder / "proj").iterdir()
    assert (run_folder / "metrics.csv").read_text().splitlines() == ["step,value", "1,1.0"]  # rank 0's value only
    assert "lr: 0.1" in (run_folder / "hparams.yaml").read_text()


def test_a_loop_killed_after_save_state_mid_epoch_resumes_bitwise_equal(jobs):
    """Killed inside an accumulation window of epoch 1 (dropout, Adam, StepLR, shuffled data, 16-mixed); a new
    job with other initial weights and RNG loads the state and ends with the uninterrupted run's weights."""
    folder, _ = job(jobs, "killed")
    assert sorted(p.name for p in (folder / "state").iterdir()) == ["engine_state.pt", "rank_0.pt", "rank_1.pt"]
    resumed = reports(job(jobs, "resumed")[0])
    uninterrupted = reports(job(jobs, "parity")[0])
    for rank in (0, 1):
        expected, actual = uninterrupted[rank]["uninterrupted"], resumed[rank]["resumed"]
        assert actual["batches"] == expected["batches"] == 14
        assert actual["lr"] == expected["lr"]
        different = [k for k in expected["weights"] if not torch.equal(expected["weights"][k], actual["weights"][k])]
        assert not different, f"rank {rank}: parameters differ after resume: {different}"


ACCELERATE_CPU = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: fp16
num_cpu_threads_per_process: 1
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
use_cpu: true
"""


def test_trainer_run_launches_an_accelerate_config_file(tmp_path):
    """`trainer run --config` with the file `accelerate config` writes for two CPU processes and fp16: the
    script's plain Engine() and Trainer() run as 2 ranks with ddp, 16-mixed, and the file's thread count."""
    (tmp_path / "acc.yaml").write_text(ACCELERATE_CPU)
    run([sys.executable, "-m", "trainer", "run", "--config", "acc.yaml", str(JOB), str(tmp_path), "launched"], tmp_path)
    for rank, report in enumerate(reports(tmp_path)):
        expected = {"precision": "16-mixed", "strategy": "ddp", "world_size": 2, "device": "cpu"}
        assert {k: report[k] for k in expected} == expected and report["trainer"] == expected, f"rank {rank}"
        assert report["threads"] == "1" and report["accumulate"] == 1 and all(report["syncs"])
        # No end_training() in this script: the group is still destroyed at exit, not left to finalization.
        assert (tmp_path / f"exit{rank}.txt").read_text() == "destroyed", f"rank {rank}"


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed (.[deepspeed])")
def test_trainer_run_launches_a_deepspeed_accelerate_file_on_cpu_ranks(tmp_path):
    """The DeepSpeed file `accelerate config` writes (same_network: false, ZeRO-2, optimizer offloaded to the CPU,
    accumulation 2) with use_cpu: a plain Trainer() fits with DeepSpeed on 2 gloo ranks and those settings."""
    (tmp_path / "ds.yaml").write_text(ACCELERATE_CPU.replace("MULTI_CPU", "DEEPSPEED").replace(
        "same_network: true", "same_network: false").replace("mixed_precision: fp16", "mixed_precision: 'no'") + (
        "deepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: cpu\n  offload_param_device: none\n"
        "  gradient_accumulation_steps: 2\n  zero3_init_flag: false\n"))  # fmt: skip
    run([sys.executable, "-m", "trainer", "run", "--config", "ds.yaml", str(JOB), str(tmp_path), "trainer_launched"],
        tmp_path)  # fmt: skip
    for rank, report in enumerate(reports(tmp_path)):
        expected = {"cls": "DeepSpeedStrategy", "stage": 2, "offload": "cpu", "accumulate": 2, "world_size": 2,
                    "device": "cpu", "global_step": 4}  # 7 batches per rank: windows 2, 2, 2, 1
        assert {k: report[k] for k in expected} == expected, f"rank {rank}"
