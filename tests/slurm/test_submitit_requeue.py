"""submitit under the real local SLURM: a fit submitted with ``executor.submit`` gets submitit's timeout signal,
saves, requeues and resumes to the weights of the uninterrupted run (launching.reference)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from launching import SCRIPTS, STEPS, assert_same_weights, load_weights, reference

submitit = pytest.importorskip("submitit", reason="the submitit test needs submitit (pip install 'trainer[submitit]')")


@pytest.mark.timeout(400)
def test_submitit_timeout_signal_requeues_and_resumes_exactly(slurm_cluster, tmp_path, monkeypatch):
    for key, value in slurm_cluster.env.items():  # sbatch (called by submitit) reads this process's environment
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import submitit_fit  # pickled by reference: the job imports it from PYTHONPATH

    out = tmp_path / "out"
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=10, nodes=1, tasks_per_node=2, cpus_per_task=1, name="train")
    job = executor.submit(submitit_fit.fit, str(out), "--steps", str(STEPS), "--pause", "0.5", "--ready-at", "2")
    deadline = time.monotonic() + 120
    while not (out / "ready").exists():
        state = slurm_cluster.job(int(job.job_id))["JobState"]
        if time.monotonic() > deadline or state not in ("PENDING", "RUNNING"):
            pytest.fail(f"training did not reach step 2 (job {state}):\n{job.stderr() or ''}")
        time.sleep(0.2)
    # what submitit's --signal=USR2@90 does 90 s before the time limit
    slurm_cluster.command("scancel", "--signal=USR2", job.job_id)
    info = slurm_cluster.wait(int(job.job_id), timeout=240)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", job.stderr()
    assert not (out / "weights-0.pt").exists(), "the first run must have stopped before the end"
    assert_same_weights(load_weights(out / "weights-1.pt"), reference())
