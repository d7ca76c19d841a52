"""``trainer env``: what the Trainer detects in this process, for bug reports.

Versions, devices, the cluster environment (torchrun, SLURM, Ray Train, Kubeflow, SkyPilot, ...) with this
process's ranks, the launcher's
settings and the variables that decide them. ``--json`` prints the same as one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

from trainer.cli.common import command_parser

ENV_PREFIXES = ("SLURM_", "TORCHELASTIC_", "TRAINER_", "PET_", "SKYPILOT_", "SUBMITIT_")
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
             "GROUP_RANK", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "NCCL_DEBUG")  # fmt: skip
SLURM_SHOWN = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
               "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NTASKS_PER_NODE", "SLURM_RESTART_COUNT")  # fmt: skip


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer env``."""
    parser = command_parser(subparsers, "env", "print what the Trainer detects here (for bug reports)", __doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=main)
    return parser


def collect() -> dict[str, Any]:
    """Everything ``trainer env`` reports, as plain values."""
    import torch

    import trainer
    from trainer.strategies.registry import strategy_names

    info: dict[str, Any] = {
        "trainer": trainer.__version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none (CPU build)",
        "cpus": os.cpu_count(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "mps": bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available(),
        "backends": {name: available for name, available in _backends(torch).items()},
        "strategies": ["auto", *strategy_names()],
        "cluster": _cluster(),
        "environment": {k: v for k, v in sorted(os.environ.items()) if _shown(k)},
    }
    if torch.cuda.is_available():
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def _shown(name: str) -> bool:
    if name.startswith("SLURM_"):
        return name in SLURM_SHOWN
    return name in ENV_NAMES or name.startswith(ENV_PREFIXES)


def _backends(torch: Any) -> dict[str, bool]:
    dist = torch.distributed
    if not dist.is_available():
        return {"distributed": False}
    return {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}


def _cluster() -> dict[str, Any]:
    """The detected cluster environment and this process's place in it."""
    from trainer.strategies.launch.environments import detect_environment

    try:
        env = detect_environment()
        if env is None:
            return {"name": "none: a plain process (the Trainer starts other processes itself when devices > 1)"}
        from trainer.integrations.submitit import submitit_signal

        name = type(env).__name__ + (" (a submitit job)" if submitit_signal() is not None else "")
        return {
            "name": name, "world_size": env.world_size(), "global_rank": env.global_rank(),
            "local_rank": env.local_rank(), "node_rank": env.node_rank(), "main_address": env.main_address,
            "main_port": env.main_port,
            # a scheduler that placed nodes (pods) only: the world size is these nodes x the Trainer's devices
            **({"nodes": env.num_nodes} if hasattr(env, "source") else {}),
        }  # fmt: skip
    except Exception as err:  # a broken environment is exactly what a bug report needs to show
        return {"name": "error", "error": f"{type(err).__name__}: {err}"}


def main(args: argparse.Namespace) -> int:
    """Print the report."""
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for sub_key, sub_value in value.items():
                print(f"  {sub_key:<{width}} {sub_value}")
        else:
            shown = ", ".join(map(str, value)) or "none" if isinstance(value, list) else value
            print(f"{key:<{width}} {shown}")
    return 0
