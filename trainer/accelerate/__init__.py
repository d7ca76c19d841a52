"""Hugging Face Accelerate's API on this framework: a script migrates by changing its imports only,
``from accelerate import ...`` → ``from trainer.accelerate import ...`` (and ``accelerate.utils`` →
``trainer.accelerate.utils``, ``accelerate.local_sgd`` → ``trainer.accelerate.local_sgd``, ``accelerate.logging`` →
``trainer.accelerate.logging``).

:class:`Accelerator` is the :class:`~trainer.engine.Engine` with Accelerate's numbers: whole batches dealt to the
processes in turn, LR schedulers stepped once per process for each optimizer step, ``gather_for_metrics`` as
Accelerate's. See docs/migrating_from_accelerate.md.
"""
from trainer.accelerate.accelerator import Accelerator, PartialState
from trainer.accelerate.launchers import debug_launcher, notebook_launcher
from trainer.accelerate.local_sgd import LocalSGD
from trainer.accelerate.utils import (
    AutocastKwargs, DataLoaderConfiguration, DDPCommunicationHookType, DistributedDataParallelKwargs,
    DistributedType, GradientAccumulationPlugin, GradScalerKwargs, InitProcessGroupKwargs, ProfileKwargs,
    ProjectConfiguration, find_executable_batch_size, skip_first_batches,
)

__all__ = [
    "Accelerator", "AutocastKwargs", "DataLoaderConfiguration", "DDPCommunicationHookType",
    "DistributedDataParallelKwargs", "DistributedType", "GradientAccumulationPlugin", "GradScalerKwargs",
    "InitProcessGroupKwargs", "LocalSGD", "ProfileKwargs", "ProjectConfiguration", "find_executable_batch_size",
    "skip_first_batches", "notebook_launcher", "debug_launcher", "PartialState",
]
