"""Launched by the CLI tests: each process writes what it was started with to OUT_DIR/rank-<RANK>.json.

With FAIL_FIRST_ATTEMPT=1 the first attempt (TORCHELASTIC_RESTART_COUNT=0) fails instead, so a test can see
torchrun's agent restart the workers."""
import json
import os
import sys
from pathlib import Path

rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
if os.environ.get("FAIL_FIRST_ATTEMPT") and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    sys.exit(3)
keys = ("TORCHELASTIC_RESTART_COUNT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TRAINER_ARGS",
        "TRAINER_CONFIG", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURMD_NODENAME", "EXTRA")
report = {key: os.environ.get(key) for key in keys}
report["argv"] = sys.argv[1:]
out = Path(os.environ.get("OUT_DIR", "."))
out.mkdir(parents=True, exist_ok=True)
(out / f"rank-{rank}.json").write_text(json.dumps(report))
