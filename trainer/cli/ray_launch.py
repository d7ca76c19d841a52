"""``trainer run --ray ADDRESS``: the same script in Ray Train workers instead of torchrun's processes.

``trainer run --ray auto --devices 4 train.py --lr 0.1`` starts ``devices`` × ``num-nodes`` workers through
``ray.train.torch.TorchTrainer`` on the cluster at ADDRESS (``auto``: the one this machine belongs to; ``local``:
a new one here), restarting the group up to ``--max-restarts`` times. The Trainer in the script joins Ray's
process group, reports its checkpoints to Ray and resumes from Ray's after a restart
(:mod:`trainer.integrations.ray`). This module keeps ``run.py``'s part to two calls.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Optional

from trainer.strategies.errors import ConfigurationError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ray ADDRESS``, ``--ray-storage PATH`` and ``--ray-gpu`` on ``trainer run``."""
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="run in Ray Train workers on the Ray cluster at ADDRESS (auto, local, ray://HOST:PORT)")  # fmt: skip
    parser.add_argument("--ray-storage", metavar="PATH", help="Ray's storage for reported checkpoints (shared or s3://)")
    parser.add_argument("--ray-gpu", action="store_true", help="one GPU per Ray worker (NCCL)")


def main(args: argparse.Namespace, config: Any, variables: dict[str, str]) -> Optional[int]:
    """Run the job on Ray when ``--ray`` was given (returns the exit status), else ``None`` (torchrun runs it)."""
    if not args.ray:
        if args.ray_storage or args.ray_gpu:
            raise ConfigurationError("--ray-storage and --ray-gpu go with --ray ADDRESS (run on a Ray cluster).")
        return None
    if args.module:
        raise ConfigurationError("--ray runs a script file; -m/--module is not supported with it.")
    workers = config.devices * config.num_nodes
    if args.dry_run:
        print(json.dumps({"ray": args.ray, "num_workers": workers, "use_gpu": args.ray_gpu, "storage": args.ray_storage,
                          "max_failures": config.max_restarts, "variables": variables,
                          "script": [args.script, *args.script_args]}))  # fmt: skip
        return 0
    try:
        from trainer.integrations import ray as ray_integration

        result = ray_integration.run_script(args.script, args.script_args, workers, args.ray, args.ray_gpu,
                                            variables, args.ray_storage, config.max_restarts)  # fmt: skip
    except ImportError as err:
        raise ConfigurationError(f"--ray needs Ray Train ({err}): pip install 'trainer[ray]'.") from None
    checkpoint = getattr(result, "checkpoint", None)
    print(f"[trainer] Ray Train finished; last checkpoint: {checkpoint.path if checkpoint else 'none'}", flush=True)
    return 0
