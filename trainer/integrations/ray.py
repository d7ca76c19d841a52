"""Ray Train: every checkpoint the Trainer writes is reported to Ray, and a restarted worker group resumes
from the checkpoint Ray holds, with no code in the training function.

Inside ``train_loop_per_worker`` of a ``ray.train.torch.TorchTrainer`` the strategy joins Ray's process group
(:class:`~trainer.strategies.launch.environments.RayEnvironment`); this module adds:

- **report**: after each full checkpoint (ModelCheckpoint's, ``save_checkpoint``, a stop signal's), every worker
  calls ``ray.train.report(metrics, checkpoint=...)``: global rank 0 with the checkpoint file, and for a sharded
  folder each rank with the files it wrote (Ray merges them into one folder in its storage);
- **resume**: when Ray restarts the worker group (``FailureConfig(max_failures=N)``), ``fit()`` without
  ``ckpt_path`` resumes from ``ray.train.get_checkpoint()``, exactly (optimizer, RNG, data position). Only the
  first fit of a restarted worker that has not reported yet does: a function that fits several models in turn
  resumes the first of them.

A worker's shard of a Ray Dataset (``ray.train.get_dataset_shard(name).iter_torch_batches(...)``, wrapped in an
iterable that iterates it anew each epoch) is training data like any iterable.

:func:`run` is the launcher: it runs a plain training script on a Ray cluster (``trainer run --ray ADDRESS``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Any, Optional

from trainer.strategies.checkpoint import storage
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.launch.environments.ray import ray_train_context

#: Written by global rank 0 into each reported checkpoint: the name of the file or folder it holds.
MARKER = "trainer_checkpoint.txt"
#: Whether this worker process reported a checkpoint. ``get_checkpoint()`` also returns what this attempt
#: reported itself (a second fit in the same function must not resume from the first's); a restarted worker
#: group is a new process, where this is False again.
_STATE = {"reported": False, "reports": 0}


def connect(trainer: Any) -> None:
    """In a Ray Train worker, report the Trainer's checkpoints to Ray and resume from Ray's; elsewhere nothing."""
    if ray_train_context() is None:
        return
    # Ray runs the training function in a thread of its worker, where Python cannot handle signals; Ray itself
    # stops and restarts the workers (no "stop signals are not handled" warning on every fit)
    trainer._faults.signals.actions.clear()
    connector = trainer._checkpoint
    connector.saved_listeners.append(RayReporter(trainer))
    connector.resume_source = lambda: checkpoint_from_ray(trainer.is_global_zero)


class RayReporter:
    """Reports each complete checkpoint to Ray Train (every rank calls: ``ray.train.report`` is a barrier)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._warned_remote = False

    def __call__(self, path: str) -> None:
        import ray.train

        trainer = self.trainer
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items()
                   if getattr(value, "numel", lambda: 1)() == 1}  # fmt: skip
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        if storage.is_remote(path):
            if not self._warned_remote and trainer.is_global_zero:
                warnings.warn(f"The checkpoint '{path}' is in remote storage: Ray Train gets its metrics only. Let Ray "
                              "keep the checkpoints (RunConfig(storage_path=...)) and save to a local folder.",
                              stacklevel=2)  # fmt: skip
                self._warned_remote = True
            ray.train.report(metrics, checkpoint=None)
            return
        staging = tempfile.mkdtemp(prefix="trainer-ray-report-")
        try:
            checkpoint = None
            if _stage(path, staging, trainer.global_rank):
                checkpoint = ray.train.Checkpoint.from_directory(staging)
            name = os.path.basename(path.rstrip(os.sep))
            # One folder per report in Ray's storage: the same name saved again (a second fit in the function,
            # the same file overwritten) must not land in the folder of an earlier report.
            index = _STATE["reports"] = _STATE["reports"] + 1
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=f"report{index:05d}-{name}")
            _STATE["reported"] = True
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _stage(path: str, staging: str, rank: int) -> bool:
    """Put this rank's part of the checkpoint at ``path`` into ``staging`` (hard links where possible); returns
    whether there is anything to report. A file is global rank 0's; a sharded folder's ``__<rank>_*`` shards are
    each rank's own and the rest (metadata, manifest) rank 0's."""
    name = os.path.basename(path.rstrip(os.sep))
    if os.path.isdir(path):
        target = os.path.join(staging, name)
        mine = [entry for entry in sorted(os.listdir(path)) if _written_by(entry, rank)]
        for entry in mine:
            os.makedirs(target, exist_ok=True)
            _link_or_copy(os.path.join(path, entry), os.path.join(target, entry))
        staged = bool(mine)
    else:
        staged = rank == 0
        if staged:
            _link_or_copy(path, os.path.join(staging, name))
    if rank == 0 and staged:
        with open(os.path.join(staging, MARKER), "w") as marker:
            marker.write(name)
    return staged


def _written_by(entry: str, rank: int) -> bool:
    if entry.startswith("__") and entry.endswith(".distcp"):  # DCP's shard files: __<rank>_<n>.distcp
        return entry[2:].split("_", 1)[0] == str(rank)
    return rank == 0


def _link_or_copy(source: str, target: str) -> None:
    if os.path.isdir(source):
        shutil.copytree(source, target)
        return
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, target)


def checkpoint_from_ray(announce: bool) -> Optional[str]:
    """The local path of the checkpoint in ``ray.train.get_checkpoint()`` (downloaded when Ray's storage is remote),
    or ``None`` on a first attempt (and once this worker reported checkpoints of its own)."""
    import ray.train

    checkpoint = None if _STATE["reported"] else ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    folder = checkpoint.path
    if type(checkpoint.filesystem).__name__ != "LocalFileSystem":
        folder = checkpoint.to_directory()
    marker = os.path.join(folder, MARKER)
    if not os.path.isfile(marker):
        raise ConfigurationError(
            f"ray.train.get_checkpoint() holds '{checkpoint.path}', which the Trainer did not report (no {MARKER}). "
            "Pass fit(ckpt_path=...) yourself for checkpoints reported by your own code."
        )
    with open(marker) as handle:
        path = os.path.join(folder, handle.read().strip())
    if announce:
        print(f"[trainer] Ray Train restarted the worker group: resuming from '{path}' (ray.train.get_checkpoint()).",
              flush=True)  # fmt: skip
    return path


def run_script(script: str, script_args: list[str], num_workers: int, address: Optional[str] = None,
               use_gpu: bool = False, variables: Optional[dict[str, str]] = None, storage_path: Optional[str] = None,
               max_failures: int = 0, name: Optional[str] = None) -> Any:  # fmt: skip
    """Run a plain training script in ``num_workers`` Ray Train workers (``trainer run --ray ADDRESS``); returns
    Ray's ``Result`` (its ``checkpoint`` is the last one the Trainer reported).

    Each worker runs the script as ``__main__`` with ``script_args``; the script must be at the same path on every
    node (a shared filesystem). ``address`` is ``ray.init``'s (``"auto"``, ``"ray://HOST:10001"``; ``None`` or
    ``"local"`` starts a local cluster). ``variables`` are exported in the workers first; ``max_failures`` restarts
    the worker group after a failure, resuming from the last checkpoint."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if not os.path.isfile(script):
        raise ConfigurationError(f"script '{script}' does not exist (resolved to '{os.path.abspath(script)}').")
    if not ray.is_initialized():
        ray.init(address=None if address in (None, "local") else address)
    config = {"script": os.path.abspath(script), "argv": list(script_args), "variables": dict(variables or {})}
    run_config = RunConfig(name=name, storage_path=storage_path, failure_config=FailureConfig(max_failures=max_failures))
    job = TorchTrainer(_run_script_in_worker, train_loop_config=config, run_config=run_config,
                       scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
                       torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"))  # fmt: skip
    return job.fit()


def _run_script_in_worker(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker`` of :func:`run_script`: the script as ``__main__``."""
    import runpy
    import sys

    os.environ.update(config["variables"])
    sys.argv = [config["script"], *config["argv"]]
    sys.path.insert(0, os.path.dirname(config["script"]))
    runpy.run_path(config["script"], run_name="__main__")
