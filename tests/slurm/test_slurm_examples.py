"""examples/slurm/digits.sbatch runs as written on the real local SLURM cluster (one epoch)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_digits_sbatch_example_trains_on_two_tasks(slurm_cluster, tmp_path):
    log = tmp_path / "job.out"
    job_id = slurm_cluster.submit(ROOT / "examples" / "slurm" / "digits.sbatch", f"--output={log}",
                                  f"--export=ALL,EPOCHS=1,ROOT_DIR={tmp_path / 'run'}", cwd=ROOT)  # fmt: skip
    info = slurm_cluster.wait(job_id, timeout=240)
    text = log.read_text() if log.exists() else "(no log)"
    assert info["JobState"] == "COMPLETED", text
    assert f"[digits] job {job_id}, restart 0" in text
    assert text.count("final validation accuracy") == 1  # printed by global rank 0 of the two tasks
