"""Ray Train: the same ``train.py`` in 2 Ray Train workers (a local Ray cluster unless ``--address`` is given).

    python examples/clusters/ray_train.py                   # ray.init() here, 2 CPU workers
    python examples/clusters/ray_train.py --address auto    # the Ray cluster this machine belongs to

Equivalent to ``trainer run --ray local --devices 2 examples/clusters/train.py``. The Trainer joins the process
group Ray made, reports every checkpoint to Ray (``result.checkpoint``) and, when Ray restarts the worker group
(``max_failures``), resumes from Ray's last checkpoint.
"""
from __future__ import annotations

import argparse
import os

from trainer.integrations.ray import run_script

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="local")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--root-dir", default=os.path.abspath("runs/clusters-ray"))
    args = parser.parse_args()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
    result = run_script(script, ["--root-dir", args.root_dir], num_workers=args.workers, address=args.address,
                        storage_path=os.path.join(args.root_dir, "ray"), max_failures=1,
                        variables={"TRAINER_ARGS": '{"devices": %d}' % args.workers})  # fmt: skip
    print(f"Ray's last checkpoint: {result.checkpoint.path if result.checkpoint else None}")
