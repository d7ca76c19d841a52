"""sync_dist values under real DDP: reduced at the sync points, and reading them on rank 0 only never hangs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
@pytest.mark.timeout(240)
def test_reading_sync_dist_metrics_on_rank_zero_only_does_not_hang():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "ddp_rank0_reads.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=190)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    rank_mean, x_mean, val_x = map(float, line.split()[1:])
    assert rank_mean == pytest.approx(0.5)  # mean over ranks 0 and 1
    assert x_mean == pytest.approx(7.5)  # every sample 0..15 exactly once, weighted by batch size
    assert val_x == pytest.approx(7.5)
