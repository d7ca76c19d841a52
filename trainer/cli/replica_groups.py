"""``trainer run --replica-groups N``: a fault-tolerant job on this machine (``ft_ddp``/``ft_hsdp``).

Starts torchft's lighthouse (unless ``TORCHFT_LIGHTHOUSE`` names one already running) and ``N`` replica groups,
each its own torchrun of ``--devices`` processes with ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS`` and
``TORCHFT_LIGHTHOUSE`` set. A group that dies is started again (up to ``--max-restarts`` times per group) and heals
from a live group; the others keep training meanwhile. The job ends when every group has finished.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Optional

from trainer.strategies.errors import ConfigurationError

POLL_S = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``trainer run``'s replica-group options."""
    parser.add_argument("--replica-groups", type=int, metavar="N",
                        help="fault tolerance: N replica groups of --devices processes each, with a lighthouse; a "
                             "group that dies restarts and heals from a live one (ft_ddp / ft_hsdp)")  # fmt: skip
    parser.add_argument("--min-replicas", type=int, default=1, metavar="K",
                        help="with --replica-groups: groups a step needs (default 1)")  # fmt: skip
    parser.add_argument("--lighthouse-port", type=int, default=0, metavar="PORT",
                        help="with --replica-groups: the lighthouse's port (default: a free one)")  # fmt: skip


def check(args: argparse.Namespace, num_nodes: int) -> None:
    """Refuse replica-group launches that cannot work, saying how to fix them."""
    groups = args.replica_groups
    if groups is None:
        if args.min_replicas != 1 or args.lighthouse_port:
            raise ConfigurationError("--min-replicas and --lighthouse-port go with --replica-groups N.")
        return
    if groups < 1:
        raise ConfigurationError(f"--replica-groups {groups} must be at least 1.")
    if getattr(args, "ray", None):
        raise ConfigurationError(
            "--replica-groups starts its groups with torchrun on this machine and --ray on a Ray cluster; choose one."
        )
    if not 1 <= args.min_replicas <= groups:
        raise ConfigurationError(f"--min-replicas {args.min_replicas} must be between 1 and --replica-groups {groups}.")
    if num_nodes > 1:
        raise ConfigurationError(
            "--replica-groups starts every group on this machine; across nodes start one `trainer run` per group "
            "with REPLICA_GROUP_ID, NUM_REPLICA_GROUPS and TORCHFT_LIGHTHOUSE set (see docs/fault_tolerance.md)."
        )


def group_command(torchrun: list[str]) -> list[str]:
    """torchrun's command for one group: the group is restarted here, not by torchrun (``--max-restarts 0``)."""
    command = list(torchrun)
    if "--max-restarts" in command:
        command[command.index("--max-restarts") + 1] = "0"
    return command


def launch(args: argparse.Namespace, torchrun: list[str], variables: dict[str, str], max_restarts: int) -> int:
    """Run the lighthouse and the groups until every group finished; returns the exit status."""
    from trainer.cli.lighthouse import lighthouse_command
    from trainer.strategies.launch.environments.local import find_free_port

    groups = args.replica_groups
    environment = {**os.environ, **variables, "NUM_REPLICA_GROUPS": str(groups)}
    lighthouse_cmd: Optional[list[str]] = None
    if "TORCHFT_LIGHTHOUSE" not in os.environ:  # else the groups report to the lighthouse it names
        port = args.lighthouse_port or find_free_port()
        lighthouse_cmd = lighthouse_command(args.min_replicas, port, join_timeout_ms=1000, heartbeat_timeout_ms=2000)
        environment["TORCHFT_LIGHTHOUSE"] = f"http://localhost:{port}"
    command = group_command(torchrun)
    if args.dry_run:
        if lighthouse_cmd is not None:
            print(shlex.join(lighthouse_cmd))
        for replica in range(groups):
            shown = {**variables, "REPLICA_GROUP_ID": str(replica), "NUM_REPLICA_GROUPS": str(groups),
                     "TORCHFT_LIGHTHOUSE": environment["TORCHFT_LIGHTHOUSE"]}  # fmt: skip
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items()), shlex.join(command))
        return 0
    lighthouse = subprocess.Popen(lighthouse_cmd, start_new_session=True) if lighthouse_cmd is not None else None
    running: dict[int, subprocess.Popen] = {}
    restarts = {replica: 0 for replica in range(groups)}

    def start(replica: int) -> None:
        running[replica] = subprocess.Popen(command, env={**environment, "REPLICA_GROUP_ID": str(replica)},
                                            start_new_session=True)  # fmt: skip

    try:
        for replica in range(groups):
            start(replica)
        while running:
            time.sleep(POLL_S)
            for replica, process in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[replica]
                if code == 0:
                    continue
                if restarts[replica] >= max_restarts:
                    print(f"trainer run: replica group {replica} exited with {code} after {restarts[replica]} "
                          f"restart(s) (--max-restarts {max_restarts}); stopping the job.", file=sys.stderr)  # fmt: skip
                    return code if code > 0 else 1
                restarts[replica] += 1
                print(f"trainer run: replica group {replica} exited with {code}; restart {restarts[replica]} of "
                      f"{max_restarts}: it heals from a live group.", file=sys.stderr)  # fmt: skip
                start(replica)
        return 0
    finally:
        for process in running.values():
            _stop(process)
        if lighthouse is not None:
            _stop(lighthouse)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM (torchrun's agent then stops its workers), SIGKILL after 30 s."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)  # started in a session of its own
        process.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        process.kill()
        process.wait(timeout=30)
