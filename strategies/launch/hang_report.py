"""Hangs end with a name: which rank stopped answering, instead of a timeout "out of nowhere".

- **Barriers** (start-up, the Trainer's own waits: data preparation, checkpoint saves, ...) are
  ``torch.distributed.monitored_barrier`` on a gloo group of their own, created at start-up beside the training's
  group (on NCCL too: monitored barriers exist only for gloo, and CPU-side barriers need no GPU stream). Rank 0
  collects every rank within the start-up timeout and names those that did not arrive (:class:`HangError`).
- **The process-group timeout** is long while the job starts (``timeout``: torch's default, 30 min on gloo and
  10 min on NCCL, covers slow imports, data downloads, compilation) and is shortened to ``train_timeout``
  after the first optimizer step (``torch.distributed.distributed_c10d._set_pg_timeout``, which changes the
  default timeout of the existing gloo or NCCL backend in place: no group is re-created), as torchtitan does.
- **When a collective times out** (gloo raises it on the waiting ranks), every rank that is still alive joins one
  monitored barrier on the monitoring group with ``report_timeout`` seconds to arrive; rank 0's error names the
  ranks that did not, with the step (:func:`unresponsive_ranks`).
- **On NCCL** a timed-out collective is caught by NCCL's watchdog thread, which ends the process before Python
  sees an error; the flight recorder (:func:`flight_recorder_env`, set before the group is created unless the
  user set those variables) then dumps each rank's last collectives to ``/tmp/nccl_trace_rank_<N>`` (torch's
  ``TORCH_FR_DUMP_TEMP_FILE`` default), and ``python -m torch.distributed.flight_recorder.fr_trace /tmp`` names the
  rank whose collective never started. The barriers above still name ranks on NCCL jobs.
"""
from __future__ import annotations

import datetime
import os
import re
from typing import Any, Optional

from trainer.strategies.errors import HangError

#: After the first step, a collective that waits this long is a hang (seconds; ``train_timeout`` changes it).
DEFAULT_TRAIN_TIMEOUT_S = 300.0
#: The flight recorder's settings on NCCL (only those the user has not set are applied).
FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}  # fmt: skip
_MISSING = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")
_TIMEOUT_WORDS = ("timed out", "timeout", "wait timeout")


def flight_recorder_env() -> dict[str, str]:
    """Set (and return) the NCCL flight-recorder variables the user has not set, so a hang leaves a dump."""
    applied = {key: value for key, value in FLIGHT_RECORDER.items() if key not in os.environ}
    os.environ.update(applied)
    return applied


def collective_timed_out(err: BaseException) -> bool:
    """Whether ``err`` is a collective (or point-to-point operation) that gave up waiting for a peer."""
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(word in text for word in _TIMEOUT_WORDS)


def create_monitor_group(timeout: Optional[datetime.timedelta]) -> Any:
    """The gloo group the monitored barriers use (every rank calls, right after the process group exists)."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timeout) if timeout is not None else dist.new_group(backend="gloo")


def monitored_barrier(group: Any, name: str, timeout: datetime.timedelta) -> None:
    """A barrier that raises :class:`HangError` naming the ranks that did not arrive within ``timeout``."""
    import torch.distributed as dist

    try:
        dist.monitored_barrier(group, timeout=timeout, wait_all_ranks=True)
    except RuntimeError as err:
        raise HangError(_barrier_message(name, err, timeout, dist.get_rank())) from None


def unresponsive_ranks(group: Any, timeout: datetime.timedelta) -> Optional[list[int]]:
    """After a collective timed out: the ranks that do not reach a monitored barrier within ``timeout``.

    ``[]`` when every rank arrived; ``None`` on a rank other than 0 that heard nothing from rank 0 (which is
    then stuck itself, or is reporting the missing ranks: only rank 0 sees them all)."""
    import torch.distributed as dist

    try:
        dist.monitored_barrier(group, timeout=timeout, wait_all_ranks=True)
    except RuntimeError as err:
        found = _MISSING.search(str(err))
        if found:
            return sorted({int(r) for r in re.findall(r"\d+", found.group(1))})
        return None
    return []


def _barrier_message(name: str, err: BaseException, timeout: datetime.timedelta, rank: int) -> str:
    found = _MISSING.search(str(err))
    seconds = timeout.total_seconds()
    if found:
        ranks = ", ".join(sorted(set(re.findall(r"\d+", found.group(1))), key=int))
        return (f"rank(s) {ranks} did not reach the barrier '{name}' within {seconds:.0f} s (rank {rank} waited): "
                "they are stuck, stopped or much slower than the others. See their stacks with "
                "`py-spy dump --pid PID`.")  # fmt: skip
    return (f"rank {rank} waited {seconds:.0f} s at the barrier '{name}' without hearing from rank 0: rank 0 is "
            f"stuck, or it is reporting another rank that did not arrive ({str(err).strip().splitlines()[0][:200]}).")
