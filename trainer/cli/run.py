"""``trainer run``: start a script on this node through ``torch.distributed.run`` (torchrun's elastic agent).

One node: ``trainer run --devices 2 train.py --lr 0.1`` (a standalone rendezvous on a free port). Several
nodes: the same command on every node with ``--num-nodes N --node-rank R --main-address HOST-OF-NODE-0
[--main-port P]``. ``--config FILE`` supplies any of these; flags override it. The agent restarts the workers
up to ``--max-restarts`` times, and the Trainer in the script joins the job it started. ``--replica-groups N``
starts a fault-tolerant job instead (:mod:`trainer.cli.replica_groups`).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from trainer.strategies.errors import ConfigurationError
from trainer.cli.common import (
    command_parser, job_variables, merged_config, non_negative_int, port, positive_int, value_options,
)
from trainer.cli import ray_launch, replica_groups
from trainer.config.yaml_config import ExperimentConfig, check_trainer_values, split_trainer_args

DEFAULT_PORT = 29500
FLAGS = ("devices", "num_nodes", "node_rank", "main_address", "main_port", "max_restarts")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer run``."""
    summary = "launch a script on this node with torchrun (torch.distributed.run)"
    parser = command_parser(subparsers, "run", summary, __doc__, "before SCRIPT")
    parser.add_argument("--config", "-c", metavar="FILE", help="experiment file written by `trainer config`")
    parser.add_argument("--devices", "--nproc-per-node", type=positive_int, metavar="N",
                        help="processes on this node, one per GPU (default 1)")  # fmt: skip
    parser.add_argument("--num-nodes", type=positive_int, metavar="N", help="nodes in the job (default 1)")
    parser.add_argument("--node-rank", type=non_negative_int, metavar="R", help="this node's index, 0..N-1")
    parser.add_argument("--main-address", metavar="HOST", help="host of node 0 (default 127.0.0.1)")
    parser.add_argument("--main-port", type=port, metavar="PORT",
                        help=f"port on node 0 (default: free on one node, {DEFAULT_PORT} on several)")  # fmt: skip
    parser.add_argument("--max-restarts", type=non_negative_int, metavar="K",
                        help="restart the workers up to K times after a failure (default 0)")  # fmt: skip
    replica_groups.add_arguments(parser)
    parser.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name, as in `python -m`")
    parser.add_argument("--dry-run", action="store_true", help="print the command and variables instead of running")
    ray_launch.add_arguments(parser)
    parser.add_argument("script", metavar="SCRIPT", help="the training script (its arguments follow it)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=main)
    return parser


def split_argv(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str], list[str]]:
    """``--trainer.*`` may appear before SCRIPT; everything after SCRIPT belongs to the script."""
    rest, tokens = split_trainer_args(argv, value_options(parser), stop_at_positional=True)
    return rest, tokens, []


def torchrun_command(config: ExperimentConfig, script: str, script_args: list[str], module: bool = False) -> list[str]:
    """The ``python -m torch.distributed.run ...`` command line for ``config``."""
    command = [sys.executable, "-m", "torch.distributed.run"]
    if config.num_nodes == 1 and config.main_port is None:
        command += ["--standalone", "--nnodes", "1"]
    else:
        command += ["--nnodes", str(config.num_nodes), "--node-rank", str(config.node_rank), "--master-addr",
                    config.main_address, "--master-port", str(config.main_port or DEFAULT_PORT)]  # fmt: skip
    command += ["--nproc-per-node", str(config.devices), "--max-restarts", str(config.max_restarts)]
    if module:
        command.append("--module")
    return command + [script, *script_args]


def check_launch(config: ExperimentConfig, script: str, module: bool) -> None:
    """Refuse launches that cannot work, saying how to fix them."""
    if config.node_rank >= config.num_nodes:
        raise ConfigurationError(
            f"--node-rank {config.node_rank} is out of range for --num-nodes {config.num_nodes}: use "
            f"0..{config.num_nodes - 1} (0 on the node whose address is --main-address)."
        )
    if config.num_nodes > 1 and "main_address" not in config.given:
        raise ConfigurationError(
            f"--num-nodes {config.num_nodes} needs --main-address: the host name or IP of node 0, reachable from "
            "every node."
        )
    if not module and not os.path.isfile(script):
        raise ConfigurationError(f"script '{script}' does not exist (resolved to '{os.path.abspath(script)}').")


def main(args: argparse.Namespace) -> int:
    """Build the torchrun command and replace this process with it (signals reach the agent directly)."""
    config = merged_config(args.config, {key: getattr(args, key) for key in FLAGS})
    if not args.ray:  # Ray places the workers itself: no node rank or main address here
        check_launch(config, args.script, args.module)
    replica_groups.check(args, config.num_nodes)
    check_trainer_values({**config.trainer, **args.trainer_args}, f"{args.config}: trainer." if args.config else "--trainer.")
    command = torchrun_command(config, args.script, args.script_args, args.module)
    variables = job_variables(config, args.config, args.trainer_args)
    on_ray = ray_launch.main(args, config, variables)
    if on_ray is not None:
        return on_ray
    if args.replica_groups:  # a lighthouse and N torchruns, each group restarted when it dies
        return replica_groups.launch(args, command, variables, config.max_restarts)
    if args.dry_run:
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items()), shlex.join(command))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, command, {**os.environ, **variables})
    return 0  # pragma: no cover - execve does not return
