"""submitit: submit ``train.py``'s fit to SLURM from Python; on submitit's timeout signal (USR2, 90 s before the
limit) the Trainer saves, requeues the job and the requeued job resumes from that checkpoint.

    python examples/clusters/submitit_train.py --partition gpu   # on a SLURM login node
    python examples/clusters/submitit_train.py --local           # submitit's local executor, no SLURM
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402  (pickled by reference: the job imports it from this folder)

if __name__ == "__main__":
    import submitit

    parser = argparse.ArgumentParser()
    parser.add_argument("--partition", default=None)
    parser.add_argument("--local", action="store_true")
    parser.add_argument("--root-dir", default=os.path.abspath("runs/clusters-submitit"))
    args = parser.parse_args()
    executor = submitit.AutoExecutor(folder=os.path.join(args.root_dir, "submitit"), cluster="local" if args.local else None)
    executor.update_parameters(timeout_min=60, nodes=1, tasks_per_node=1, name="train")
    if args.partition:
        executor.update_parameters(slurm_partition=args.partition)
    job = executor.submit(train.main, ["--root-dir", args.root_dir])
    print(f"submitted job {job.job_id}; waiting for it")
    job.result()
    print(job.stdout().strip().splitlines()[-1] if job.stdout() else "done")
