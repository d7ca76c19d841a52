"""Training under the real local SLURM: sbatch of a `trainer slurm` script, auto-requeue, two nodes.

Each job must end with the weights of the same training run as 2 processes without SLURM (launching.reference).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from launching import STEPS, TRAIN, assert_same_weights, load_weights, reference, run, trainer_command


def submit_training(cluster, folder: Path, *slurm_args: str, script_args: tuple[str, ...] = ()) -> tuple[int, Path]:
    """Write the sbatch script with `trainer slurm` (CPU tasks) and submit it; returns the job id and output folder."""
    out = folder / "out"
    run(trainer_command("slurm", str(TRAIN), "--accelerator", "cpu", "--time", "10", "-o", "job.sbatch",
                        "--env", "OMP_NUM_THREADS=1", *slurm_args, "--", str(out), "--steps", str(STEPS),
                        *script_args), env=cluster.env, cwd=folder)  # fmt: skip
    return cluster.submit(folder / "job.sbatch", cwd=folder), out


def job_log(folder: Path, job_id: int) -> str:
    path = folder / "logs" / f"train-{job_id}.out"
    return path.read_text() if path.exists() else "(no log)"


def wait_until_ready(cluster, job_id: int, out: Path, folder: Path, timeout: float = 120) -> None:
    """Wait until the job's first run has passed step 2 (``--ready-at 2``)."""
    deadline = time.monotonic() + timeout
    while not (out / "ready").exists():
        state = cluster.job(job_id)["JobState"]
        if time.monotonic() > deadline or state not in ("PENDING", "RUNNING"):
            pytest.fail(f"training did not reach step 2 (job {state}):\n{job_log(folder, job_id)}")
        time.sleep(0.2)


def test_sbatch_two_tasks_equals_two_processes_without_slurm(slurm_cluster, tmp_path):
    job_id, out = submit_training(slurm_cluster, tmp_path, "--devices-per-node", "2")
    info = slurm_cluster.wait(job_id, timeout=180)
    assert info["JobState"] == "COMPLETED", job_log(tmp_path, job_id)
    assert_same_weights(load_weights(out / "weights-0.pt"), reference())


def test_requeue_on_sigusr1_resumes_to_the_uninterrupted_weights(slurm_cluster, tmp_path):
    job_id, out = submit_training(slurm_cluster, tmp_path, "--devices-per-node", "2",
                                  script_args=("--pause", "0.5", "--ready-at", "2", "--user-handler"))  # fmt: skip
    wait_until_ready(slurm_cluster, job_id, out, tmp_path)
    slurm_cluster.command("scancel", "--signal=USR1", str(job_id))  # what --signal=USR1@90 does before the limit
    info = slurm_cluster.wait(job_id, timeout=240)
    log = job_log(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert f"[trainer] job {job_id}, restart 1" in log and "requeue" in log.lower()
    assert not (out / "weights-0.pt").exists(), "the first run must have stopped before the end"
    assert (out / "user-handler-0").exists() and (out / "user-handler-1").exists(), "the script's handler is chained"
    assert_same_weights(load_weights(out / "weights-1.pt"), reference())


def test_two_emulated_nodes_one_task_each(two_node_cluster, tmp_path):
    job_id, out = submit_training(two_node_cluster, tmp_path, "--nodes", "2", "--partition", "two")
    info = two_node_cluster.wait(job_id, timeout=180)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "node[1-2]", job_log(tmp_path, job_id)
    assert_same_weights(load_weights(out / "weights-0.pt"), reference())


def test_sigterm_saves_and_exits_without_requeue(slurm_cluster, tmp_path):
    job_id, out = submit_training(slurm_cluster, tmp_path, "--devices-per-node", "2",
                                  script_args=("--pause", "0.5", "--ready-at", "2"))  # fmt: skip
    wait_until_ready(slurm_cluster, job_id, out, tmp_path)
    slurm_cluster.command("scancel", "--signal=TERM", str(job_id))
    info = slurm_cluster.wait(job_id, timeout=120)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", job_log(tmp_path, job_id)
    assert (out / "checkpoints" / "interrupted.ckpt").exists() and not (out / "weights-0.pt").exists()


def test_a_task_count_mismatch_names_the_matching_sbatch_lines(slurm_cluster, tmp_path):
    """Two tasks, but the Trainer is told devices=1: the job fails saying which #SBATCH lines would match."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "job.sbatch").write_text(
        f"#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --output={tmp_path}/logs/train-%j.out\n"
        f"export TRAINER_ARGS='{{\"devices\": 1, \"accelerator\": \"cpu\"}}'\n"
        f"srun {sys.executable} {TRAIN} {tmp_path / 'out'} --steps 1\n"
    )
    job_id = slurm_cluster.submit(tmp_path / "job.sbatch", cwd=tmp_path)
    info = slurm_cluster.wait(job_id, timeout=120)
    log = job_log(tmp_path, job_id)
    assert info["JobState"] == "FAILED", log
    assert "SLURM started 2 task(s)" in log and "#SBATCH --ntasks-per-node=1" in log
