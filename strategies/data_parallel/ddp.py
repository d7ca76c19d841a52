"""``strategy="ddp"`` / ``"ddp_spawn"``: one process per device, gradients averaged by
``torch.nn.parallel.DistributedDataParallel`` (gloo on CPU, nccl on CUDA).

Per training step this adds nothing to what a hand-written DDP loop does: ``training_step`` runs through
the DDP wrapper's forward (so DDP prepares the all-reduce), backward all-reduces the gradient buckets,
and inside an accumulation window ``no_sync`` skips the all-reduce of the non-stepping micro-batches.
Evaluation steps run on the unwrapped module: no collective per batch, so ranks may run different
numbers of evaluation batches.
"""
from __future__ import annotations

import contextlib
import datetime
from typing import Any, ContextManager, Optional, Union

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.strategies.launch.environments import ClusterEnvironment
from trainer.strategies.launch.hang_report import DEFAULT_TRAIN_TIMEOUT_S
from trainer.strategies.parallel import ParallelStrategy
from trainer.strategies.precision import Precision
from trainer.strategies.data_parallel.redirection import ForwardRedirection
from trainer.strategies.strategy import materialize_on

_NULL_CONTEXT = contextlib.nullcontext()


class DDPStrategy(ParallelStrategy):
    """Distributed data parallel training.

    Args:
        start_method: ``"popen"`` (``"ddp"``: re-run the script for the other ranks) or ``"spawn"``
            (``"ddp_spawn"``: new processes per stage via torch.multiprocessing; rank 0's result comes back).
        find_unused_parameters: let DDP tolerate parameters that get no gradient in a step (slower).
        static_graph: promise DDP the set of used parameters never changes (enables optimisations).
        gradient_as_bucket_view: gradients alias DDP's communication buckets (saves memory and a copy).
        timeout: process-group timeout (seconds or ``timedelta``) while the job starts; torch's default if None.
        train_timeout: the timeout after the first optimizer step (default 300 s): a rank that stops answering
            then ends the job, named (:mod:`trainer.strategies.launch.hang_report`). None keeps ``timeout``.
        process_group_backend: ``"gloo"``/``"nccl"``; None picks nccl on CUDA and gloo on the CPU.
        cluster_environment: override detection (torchrun / SLURM / local).
        **ddp_kwargs: passed on to ``DistributedDataParallel`` (e.g. ``bucket_cap_mb``, ``broadcast_buffers``).
    """

    def __init__(
        self,
        start_method: str = "popen",
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        timeout: Union[None, float, datetime.timedelta] = None,
        process_group_backend: Optional[str] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        precision: Optional[Precision] = None,
        train_timeout: Union[None, float, datetime.timedelta] = DEFAULT_TRAIN_TIMEOUT_S,
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(cluster_environment, process_group_backend, timeout, start_method, precision, train_timeout)
        self.strategy_name = "ddp" if start_method == "popen" else "ddp_spawn"
        self.ddp_kwargs = dict(
            find_unused_parameters=find_unused_parameters, static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view, **ddp_kwargs,
        )  # fmt: skip
        self._run_training_step: Any = None

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Convert for the precision, move to this rank's device, wrap in ``DistributedDataParallel``
        (which broadcasts rank 0's parameters so every rank starts identical)."""
        materialize_on(module, self.root_device)
        self.module = self.precision.convert_module(module).to(self.root_device)
        if not any(p.requires_grad for p in self.module.parameters()):
            self.model = self.module  # nothing to synchronise (e.g. evaluating a frozen model)
            self._run_training_step = self.module.training_step
            return self.model
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        self.model = DistributedDataParallel(self.module, device_ids=device_ids, **self.ddp_kwargs)
        self._run_training_step = ForwardRedirection(self.model, self.module, "training_step")
        return self.model

    def training_step(self, *args: Any) -> Any:
        """``module.training_step`` run through the DDP wrapper's forward."""
        with self.precision.forward_context():
            return self._run_training_step(*args)

    def backward_sync(self, should_sync: bool, model: Optional[nn.Module] = None) -> ContextManager:
        """``no_sync()`` on micro-batches that do not end an accumulation window."""
        if should_sync:
            return _NULL_CONTEXT
        model = self.model if model is None else model
        return model.no_sync() if isinstance(model, DistributedDataParallel) else _NULL_CONTEXT

    def teardown(self) -> None:
        self._run_training_step = None
        super().teardown()
