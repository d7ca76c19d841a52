"""`trainer slurm --submit` against the real local cluster (the fixture in conftest.py starts it)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent.parent / "scripts"


def test_submit_prints_the_job_id_and_the_job_runs_every_task(slurm_cluster, tmp_path):
    env = dict(slurm_cluster.env, OUT_DIR=str(tmp_path / "out"))
    result = subprocess.run([sys.executable, "-m", "trainer", "slurm", str(SCRIPTS / "report.py"), "--accelerator", "cpu",
                             "--devices-per-node", "2", "--time", "5", "--trainer.max_epochs", "2", "--submit",
                             "--", "x"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_id = int(re.search(r"Submitted batch job (\d+)", result.stdout).group(1))
    info = slurm_cluster.wait(job_id, timeout=90)
    log = (tmp_path / "logs" / f"report-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", log
    assert f"[trainer] job {job_id}, restart 0" in log
    reports = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["SLURM_PROCID"], r["SLURM_NTASKS"], r["SLURM_JOB_ID"]) for r in reports] == [
        ("0", "2", str(job_id)), ("1", "2", str(job_id))]
    assert json.loads(reports[1]["TRAINER_ARGS"]) == {"devices": 2, "num_nodes": 1, "accelerator": "cpu", "max_epochs": 2}
    assert reports[0]["argv"] == ["x"]


def test_two_emulated_nodes_one_task_each(two_node_cluster, tmp_path):
    env = dict(two_node_cluster.env, OUT_DIR=str(tmp_path / "out"))
    subprocess.run([sys.executable, "-m", "trainer", "slurm", str(SCRIPTS / "report.py"), "--accelerator", "cpu",
                    "--nodes", "2", "--partition", "two", "-o", "job.sbatch"], env=env, cwd=tmp_path, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    job_id = two_node_cluster.submit(tmp_path / "job.sbatch", cwd=tmp_path, env=env)
    assert two_node_cluster.wait(job_id, timeout=90)["JobState"] == "COMPLETED"
    reports = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["SLURMD_NODENAME"] for r in reports] == ["node1", "node2"]
