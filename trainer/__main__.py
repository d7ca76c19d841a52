"""``python -m trainer COMMAND``: ``checkpoint consolidate`` and ``estimate-memory``.

A minimal entry point until the full command line (``trainer/cli``) lands; that then replaces this file and
lists these two command modules with its own (each provides ``add_parser(subparsers)``, which sets ``handler``).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

from strategies.checkpoint_io import CheckpointError
from strategies.errors import ConfigurationError

COMMAND_MODULES = ("trainer.consolidate", "trainer.memory")


def main(argv: Optional[list[str]] = None) -> int:
    """Run a command; returns the exit status (2 with one ``error:`` line on misuse)."""
    parser = argparse.ArgumentParser(prog="trainer")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.handler(args) or 0)
    except (ConfigurationError, CheckpointError, FileNotFoundError) as err:
        print(f"trainer {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
