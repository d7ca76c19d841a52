"""``strategy="ddp_spawn"``: run a stage in N new processes (``torch.multiprocessing``) and hand rank 0's
result back to the caller.

Everything ``fn`` needs (the Trainer, the module, the data) is pickled to the new processes, so the
script must guard its entry point with ``if __name__ == "__main__":``. When a rank raises, the others
are stopped and the caller gets a :class:`RankFailedError` carrying the traceback of the rank that
failed first.
"""
from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch import nn

from trainer.strategies.launch.environments.local import LocalEnvironment, find_free_port
from trainer.strategies.errors import ConfigurationError, RankFailedError

#: After one rank fails, the others get this long to stop by themselves before SIGTERM (then SIGKILL).
GRACE_PERIOD_S = 5.0
_RESULT = "result.pt"


def _unshare_modules(value: Any) -> None:
    """torch.multiprocessing hands CPU tensors to the new processes in shared memory: without private copies,
    every rank's optimizer would step the same parameters."""
    if isinstance(value, nn.Module):
        for tensor in itertools.chain(value.parameters(), value.buffers()):
            if tensor.is_shared():
                tensor.data = tensor.data.clone()
    elif isinstance(value, (list, tuple)):
        for item in value:
            _unshare_modules(item)
    elif isinstance(value, dict):
        for item in value.values():
            _unshare_modules(item)


def _run_rank(
    local_rank: int, fn: Callable[..., Any], args: tuple, variables: dict[str, str], folder: str, threads: int
) -> None:
    """Entry point of one spawned process: become ``local_rank``, run ``fn``, write rank 0's result."""
    torch.set_num_threads(threads)  # what the caller chose (a re-run script would have set it itself)
    _unshare_modules(args)
    os.environ.update(variables)
    os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["RANK"] = str(int(variables["NODE_RANK"]) * int(variables["LOCAL_WORLD_SIZE"]) + local_rank)
    try:
        result = fn(*args)
    except BaseException:
        # Timestamped, so the caller reports the rank that failed first, not one that lost its peer after.
        Path(folder, f"failed-{os.environ['RANK']}.txt").write_text(f"{time.time()!r}\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)
    if os.environ["RANK"] == "0":
        tmp = Path(folder, _RESULT + ".tmp")
        torch.save(result, tmp)
        tmp.replace(Path(folder, _RESULT))


def _first_failure(folder: str) -> tuple[int, str]:
    reports = []
    for path in Path(folder).glob("failed-*.txt"):
        stamp, _, text = path.read_text().partition("\n")
        reports.append((float(stamp), int(path.stem.split("-")[1]), text))
    if not reports:
        return -1, ""
    _, rank, text = min(reports)
    return rank, text


class SpawnLauncher:
    """Starts every local rank with ``torch.multiprocessing.start_processes`` for each stage."""

    #: The stage runs in new processes: the caller gets rank 0's return value and must restore its own state.
    runs_in_caller = False

    def __init__(self, environment: LocalEnvironment, num_processes: int, start_method: str = "spawn") -> None:
        if start_method not in mp.get_all_start_methods():
            raise ConfigurationError(
                f"start_method={start_method!r} is not available on this platform; use one of {mp.get_all_start_methods()}."
            )
        self.environment = environment
        self.num_processes = num_processes
        self.start_method = start_method

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on every local rank; return global rank 0's result (``None`` on other nodes)."""
        self.environment.check_launch()
        variables = self.environment.launch_variables(0)
        if "MASTER_PORT" not in os.environ and self.environment.num_nodes == 1:
            variables["MASTER_PORT"] = str(find_free_port())  # a fresh port for every stage
        folder = tempfile.mkdtemp(prefix="trainer-spawn-")
        try:
            try:
                context = mp.start_processes(
                    _run_rank, args=(fn, args, variables, folder, torch.get_num_threads()), nprocs=self.num_processes,
                    join=False, start_method=self.start_method,
                )  # fmt: skip
            except (TypeError, AttributeError, ValueError) as err:  # pickling the stage failed
                if "pickle" not in str(err).lower():
                    raise
                raise ConfigurationError(
                    f"strategy='ddp_spawn' must pickle the Trainer, the module and the data to send them to new "
                    f"processes, and pickling failed: {err}. Make them picklable (no lambdas or open handles), or use "
                    "strategy='ddp', which re-runs the script instead."
                ) from err
            try:
                while not context.join(grace_period=GRACE_PERIOD_S):
                    pass
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
                rank, text = _first_failure(folder)
                if rank < 0:
                    raise RankFailedError(f"a spawned rank failed: {err}") from None
                raise RankFailedError(f"rank {rank} failed:\n{text}") from None
            result_path = Path(folder, _RESULT)
            return torch.load(result_path, weights_only=False) if result_path.exists() else None
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def __repr__(self) -> str:
        return f"SpawnLauncher(num_processes={self.num_processes}, start_method={self.start_method!r})"
