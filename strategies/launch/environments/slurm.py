"""Joining a job started by SLURM's ``srun``: ranks from ``SLURM_*`` variables, rank 0's host from the nodelist."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from typing import Optional, Union

from trainer.strategies.launch.environments.base import ClusterEnvironment, env_int
from trainer.strategies.errors import ConfigurationError

_INTERACTIVE_JOB_NAMES = ("bash", "interactive")
REQUEUE_COMMAND_VARIABLE = "TRAINER_REQUEUE_COMMAND"
DEFAULT_REQUEUE_COMMAND = "scontrol requeue {job_id}"
_BRACKET = re.compile(r"\[([^\]]*)\]")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM hostlist: ``"node[01-03,7],gpu5"`` → ``["node01", "node02", "node03", "node7", "gpu5"]``.

    Ranges keep their zero padding; several bracket groups in one name expand as a product
    (``"r[1-2]n[1-2]"`` → ``r1n1, r1n2, r2n1, r2n2``).
    """
    hosts: list[str] = []
    for name in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_name(name))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_name(name: str) -> list[str]:
    match = _BRACKET.search(name)
    if match is None:
        return [name]
    prefix, suffix = name[: match.start()], name[match.end():]
    expanded: list[str] = []
    for item in match.group(1).split(","):
        low, _, high = item.strip().partition("-")
        if not high:
            values = [low]
        else:
            width = len(low)
            values = [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
        for value in values:
            expanded.extend(_expand_name(prefix + value + suffix))
    return expanded


class SLURMEnvironment(ClusterEnvironment):
    """Ranks from ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NODEID``/``SLURM_NTASKS``; ``MASTER_ADDR`` defaults
    to the first host of ``SLURM_NODELIST`` and ``MASTER_PORT`` to one derived from the job id. srun started
    every process: never launch more.

    Auto-requeue: on ``requeue_signal`` (SIGUSR1, what ``#SBATCH --signal=USR1@90`` sends before the time limit)
    the Trainer saves a checkpoint, global rank 0 runs ``requeue_command`` and the requeued job resumes from that
    checkpoint. ``requeue_command`` (or the ``TRAINER_REQUEUE_COMMAND`` variable, for containers without
    ``scontrol``) is a shell-style command line in which ``{job_id}`` becomes the job id.
    """

    creates_processes_externally = True

    def __init__(self, auto_requeue: bool = True, requeue_signal: Union[str, int, signal.Signals] = signal.SIGUSR1,
                 requeue_command: Optional[str] = None) -> None:  # fmt: skip
        self.auto_requeue = bool(auto_requeue)
        try:
            self.requeue_signal = _as_signal(requeue_signal)
        except (KeyError, ValueError):
            raise ConfigurationError(
                f"requeue_signal={requeue_signal!r} is not a signal. Use a name such as 'SIGUSR1' or a signal.Signals."
            ) from None
        self._requeue_command = requeue_command

    @staticmethod
    def detect() -> bool:
        """True in a task started by srun/sbatch (not in an interactive ``salloc`` shell, where the Trainer
        launches processes itself)."""
        return (
            "SLURM_NTASKS" in os.environ
            and "SLURM_PROCID" in os.environ
            and os.environ.get("SLURM_JOB_NAME") not in _INTERACTIVE_JOB_NAMES
        )

    def world_size(self) -> int:
        return env_int("SLURM_NTASKS")

    def global_rank(self) -> int:
        return env_int("SLURM_PROCID")

    def local_rank(self) -> int:
        return env_int("SLURM_LOCALID", 0)

    def node_rank(self) -> int:
        return env_int("SLURM_NODEID", 0)

    def num_nodes(self) -> int:
        """Nodes in the allocation (``SLURM_NNODES``)."""
        return env_int("SLURM_NNODES", 1)

    def local_world_size(self) -> int:
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "")
        if per_node.isdigit():
            return int(per_node)
        return max(self.world_size() // max(self.num_nodes(), 1), 1)

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        nodelist = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            return "127.0.0.1"
        return expand_nodelist(nodelist)[0]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return env_int("MASTER_PORT")
        # Every task of the job derives the same port; different jobs on one node rarely collide.
        job_id = os.environ.get("SLURM_JOB_ID", "0")
        digits = "".join(c for c in job_id if c.isdigit())[-4:] or "0"
        return 15000 + int(digits)

    def validate(self, num_devices: int, num_nodes: int) -> None:
        tasks, nodes = self.world_size(), self.num_nodes()
        if tasks == num_devices * num_nodes and nodes == num_nodes:
            return
        gpu_line = "\n    #SBATCH --gres=gpu:%d          # on GPU nodes" % num_devices
        raise ConfigurationError(
            f"SLURM started {tasks} task(s) on {nodes} node(s) (SLURM_NTASKS={tasks}, SLURM_NNODES={nodes}), but the "
            f"Trainer is configured for devices={num_devices} x num_nodes={num_nodes} = {num_devices * num_nodes} "
            "processes. Either change devices/num_nodes to match the allocation, or request matching tasks in your "
            f"batch script:\n    #SBATCH --nodes={num_nodes}\n    #SBATCH --ntasks-per-node={num_devices}{gpu_line}\n"
            "and start the script with `srun python train.py`. To let the Trainer start the processes itself inside "
            "one SLURM task instead, pass strategy=DDPStrategy(cluster_environment=LocalEnvironment())."
        )

    # ------------------------------------------------------------------ requeue
    @staticmethod
    def restart_count() -> int:
        """How often SLURM has requeued this job (``SLURM_RESTART_COUNT``; 0 on the first run)."""
        return env_int("SLURM_RESTART_COUNT", 0)

    def requeue_command(self) -> list[str]:
        """The command that requeues this job: the argument, else ``TRAINER_REQUEUE_COMMAND``, else ``scontrol``."""
        text = self._requeue_command or os.environ.get(REQUEUE_COMMAND_VARIABLE) or DEFAULT_REQUEUE_COMMAND
        job_id = os.environ.get("SLURM_JOB_ID", "")  # an array task has its own job id too
        return [part.replace("{job_id}", job_id) for part in shlex.split(text)]

    def requeue(self, timeout: float = 60) -> None:
        """Run the requeue command; raise ``RuntimeError`` with its output when it fails."""
        command = self.requeue_command()
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RuntimeError(
                f"Could not requeue the SLURM job with `{shlex.join(command)}`: {err}. Where scontrol is not available "
                f"(e.g. in a container), set {REQUEUE_COMMAND_VARIABLE} to a command that requeues job {{job_id}}."
            ) from None
        if result.returncode != 0:
            raise RuntimeError(
                f"`{shlex.join(command)}` failed with status {result.returncode}: {(result.stderr or result.stdout).strip()}"
            )


def _as_signal(value: Union[str, int, signal.Signals]) -> signal.Signals:
    if isinstance(value, str):
        name = value.upper()
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    return signal.Signals(value)
