"""`trainer slurm --submit --plan MODULE` on the real local cluster: a layout the plan refuses is never queued."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent.parent / "scripts"
MODULE = f"{SCRIPTS / 'plan_lm.py'}:make_module"


def test_submit_refuses_a_layout_the_plan_rejects_without_submitting(slurm_cluster, tmp_path):
    before = slurm_cluster.command("squeue", "-h", "-o", "%i").stdout.split()
    result = subprocess.run([sys.executable, "-m", "trainer", "slurm", str(SCRIPTS / "report.py"), "--accelerator", "cpu",
                             "--devices-per-node", "3", "--time", "5", "--submit", "--plan", MODULE, "--plan-args",
                             "--strategy nd_parallel --tp 3 --micro-batch-size 2 --seq-len 16"],
                            env=slurm_cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the plan refuses this job, so nothing was submitted" in result.stderr
    assert "--tp 3 does not divide the 4 attention heads" in result.stderr
    assert "Submitted batch job" not in result.stdout and not list(tmp_path.glob("*.sbatch"))
    assert slurm_cluster.command("squeue", "-h", "-o", "%i").stdout.split() == before
