"""The ``trainer`` command line (also ``python -m trainer``).

=============  ==============================================================================
``config``     write an experiment/launch file (prompts on a terminal, flags otherwise)
``run``        launch a script on this node through ``torch.distributed.run`` (torchrun)
``slurm``      write an sbatch script for a SLURM cluster, and submit it with ``--submit``
``k8s``        write a Kubeflow PyTorchJob/TrainJob manifest for a Kubernetes cluster
``env``        print what the Trainer detects here (cluster, ranks, devices, versions)
``checkpoint`` ``consolidate DIR OUT``: one file from a sharded folder; ``export --format hf``: an HF folder
``estimate-memory``  per-device memory under each strategy or layout (arithmetic); the recommendation is planned
``plan``       a dry run of the whole job on fake ranks: memory, collectives, step time, refusals (exit 2)
``lighthouse`` torchft's lighthouse, for fault-tolerant replica groups (``ft_ddp``/``ft_hsdp``)
=============  ==============================================================================

Each subcommand is a module of this package (``estimate-memory``: ``estimate_memory``) with ``add_parser(subparsers)`` (which sets ``handler``) and,
where it takes ``--trainer.*`` arguments, ``split_argv(argv, parser)`` → (its own arguments, the
``--trainer.*`` tokens, arguments passed through to the script). A misuse ends with one
``error: ...`` line saying what to change (exit status 2), not a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

from trainer.strategies.errors import ConfigurationError

COMMANDS = ("config", "run", "slurm", "k8s", "env", "checkpoint", "estimate_memory", "plan", "lighthouse")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each command's sub-parser."""
    parser = argparse.ArgumentParser(prog="trainer", description="Configure and launch training with trainer.")
    parser.add_argument("--version", action="version", version=version_line())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    commands = {name: importlib.import_module(f"trainer.cli.{name}").add_parser(subparsers) for name in COMMANDS}
    return parser, commands


def version_line() -> str:
    """``trainer --version``: this package's version and torch's, as a bug report wants them."""
    import torch

    from trainer import __version__

    return f"trainer {__version__} (distribution trainwright), torch {torch.__version__}, Python {sys.version.split()[0]}"


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = build_parser()
    command = argv[0] if argv and argv[0] in commands else None
    tokens: list[str] = []
    passthrough: list[str] = []
    module = importlib.import_module(f"trainer.cli.{command}") if command else None
    if module is not None and hasattr(module, "split_argv"):
        rest, tokens, passthrough = module.split_argv(argv[1:], commands[command])
        argv = [command, *rest]
    args = parser.parse_args(argv)
    args.passthrough = passthrough
    try:
        from trainer.config.yaml_config import parse_trainer_args

        args.trainer_args = parse_trainer_args(tokens)
        return int(args.handler(args) or 0)
    except ConfigurationError as err:
        print(f"trainer {args.command}: error: {err}", file=sys.stderr)
        return 2
