"""``trainer lighthouse``: start torchft's lighthouse, which forms each step's quorum of replica groups.

``trainer lighthouse --min-replicas 1 [--port 29510]`` runs in the foreground until stopped; every replica group of
an ``ft_ddp``/``ft_hsdp`` job reaches it at ``TORCHFT_LIGHTHOUSE=http://HOST:PORT``. ``trainer run --replica-groups
N`` starts one by itself; start your own for SLURM or Kubernetes (one lighthouse per job, reachable from every
group).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from typing import Any

from trainer.cli.common import command_parser, port, positive_int
from trainer.strategies.errors import ConfigurationError

DEFAULT_PORT = 29510


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer lighthouse``."""
    parser = command_parser(subparsers, "lighthouse", "start torchft's lighthouse for fault-tolerant replica groups",
                            __doc__)  # fmt: skip
    parser.add_argument("--min-replicas", type=positive_int, required=True, metavar="N",
                        help="replica groups a quorum needs (1: a lone survivor carries on)")  # fmt: skip
    parser.add_argument("--port", type=port, default=DEFAULT_PORT, metavar="PORT",
                        help=f"port to listen on (default {DEFAULT_PORT})")  # fmt: skip
    parser.add_argument("--join-timeout-ms", type=positive_int, default=60000, metavar="MS",
                        help="how long a new quorum waits for heartbeating stragglers (default 60000)")  # fmt: skip
    parser.add_argument("--quorum-tick-ms", type=positive_int, default=100, metavar="MS",
                        help="how often a pending quorum is re-checked (default 100)")  # fmt: skip
    parser.add_argument("--heartbeat-timeout-ms", type=positive_int, default=5000, metavar="MS",
                        help="silence after which a group counts as dead (default 5000)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.set_defaults(handler=main)
    return parser


def lighthouse_binary() -> str:
    """The ``torchft_lighthouse`` program installed with torchft (next to this Python, or on ``PATH``)."""
    beside = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    found = beside if os.path.isfile(beside) else shutil.which("torchft_lighthouse")
    if not found:
        raise ConfigurationError(
            "torchft's lighthouse (`torchft_lighthouse`) is not installed: `pip install torchft-nightly` (or the "
            "'ft' extra of this package)."
        )
    return found


def lighthouse_command(min_replicas: int, port_number: int, join_timeout_ms: int = 60000, quorum_tick_ms: int = 100,
                       heartbeat_timeout_ms: int = 5000) -> list[str]:  # fmt: skip
    """The lighthouse's command line."""
    return [lighthouse_binary(), "--min_replicas", str(min_replicas), "--bind", f"[::]:{port_number}",
            "--join_timeout_ms", str(join_timeout_ms), "--quorum_tick_ms", str(quorum_tick_ms),
            "--heartbeat_timeout_ms", str(heartbeat_timeout_ms)]  # fmt: skip


def main(args: argparse.Namespace) -> int:
    """Replace this process with the lighthouse (signals reach it directly)."""
    command = lighthouse_command(args.min_replicas, args.port, args.join_timeout_ms, args.quorum_tick_ms,
                                 args.heartbeat_timeout_ms)  # fmt: skip
    if args.dry_run:
        print(shlex.join(command))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
    return 0  # pragma: no cover - execv does not return
