"""``strategy="ft_ddp"`` (``FaultTolerantStrategy``): DDP inside each replica group, torchft across the groups.

A dead group does not stop the others: each step's gradient is averaged over the groups of that step's quorum,
and a restarted group heals from a live peer (see :mod:`.replica_groups`). Inside a group it is plain DDP: the
group's ranks all-reduce on the group's process group, then each rank all-reduces with the same rank of the
other groups through torchft's manager (a DDP communication hook), so one bucket costs two all-reduces.

What a step means when a group is missing: the average is over the groups present, the optimizer steps once,
``global_step`` counts committed steps only (a step during which a peer died is dropped on every survivor and
the next batch is trained instead), and the batches of the missing groups are skipped, counted in
``ft/samples_skipped``.
"""
from __future__ import annotations

import datetime
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from trainer.strategies.data_parallel.ddp import DDPStrategy
from trainer.strategies.data_parallel.replica_groups import ReplicaGroupMember
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.launch.environments import ClusterEnvironment
from trainer.strategies.precision import Precision


def _group_then_replicas(state, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook (``bucket``: a ``dist.GradBucket``; returns a completed future of its buffer): average
    over the group's ranks, then over the quorum's groups (torchft). Unannotated: DDP checks the annotations'
    objects, which ``from __future__ import annotations`` turns into strings."""
    strategy, group_world = state
    buffer = bucket.buffer()
    if group_world > 1:
        dist.all_reduce(buffer)
        buffer /= group_world
    work = strategy.manager.allreduce(buffer)
    work.wait()  # an error is recorded by the manager (the step will not commit), not raised
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


class FaultTolerantStrategy(ReplicaGroupMember, DDPStrategy):
    """Data parallel over replica groups that survive each other's failures (torchft).

    Args:
        min_replicas, lighthouse, replica_id, num_replica_groups, ft_timeout, quorum_timeout, connect_timeout,
            mode, sync_every, outer_lr: see :class:`~trainer.strategies.data_parallel.replica_groups.ReplicaGroupMember`.
        timeout, train_timeout, process_group_backend, cluster_environment, precision: as :class:`DDPStrategy`,
            for the group's own process group.
    """

    strategy_name = "ft_ddp"

    def __init__(
        self,
        min_replicas: int = 1,
        lighthouse: Optional[str] = None,
        replica_id: Optional[int] = None,
        num_replica_groups: Optional[int] = None,
        ft_timeout: float = 30.0,
        quorum_timeout: float = 120.0,
        connect_timeout: float = 30.0,
        mode: str = "sync",
        sync_every: int = 20,
        outer_lr: float = 0.7,
        timeout: Union[None, float, datetime.timedelta] = None,
        process_group_backend: Optional[str] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        precision: Optional[Precision] = None,
        **ddp_kwargs: Any,
    ) -> None:
        # find_unused_parameters keeps DDP from rebuilding its buckets after the first step (as torchft's DDP): a
        # group that heals mid-run must pair its buckets with its peers' in the cross-group all-reduce.
        ddp_kwargs.setdefault("find_unused_parameters", True)
        super().__init__(timeout=timeout, process_group_backend=process_group_backend,
                         cluster_environment=cluster_environment, precision=precision, **ddp_kwargs)  # fmt: skip
        self.strategy_name = "ft_ddp"
        self._init_replicas(min_replicas, lighthouse, replica_id, num_replica_groups, ft_timeout, quorum_timeout,
                            connect_timeout, mode, sync_every, outer_lr)  # fmt: skip

    def setup_environment(self) -> None:
        """The group's process group, then this group's torchft manager."""
        super().setup_environment()
        if self.manager is None:
            self._start_manager()

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Synchronous mode: DDP with the two-level all-reduce hook; semi-synchronous: plain DDP in the group."""
        runner = super().setup_module(module)
        if self.mode == "sync" and isinstance(runner, nn.parallel.DistributedDataParallel):
            runner.register_comm_hook((self, self.world_size), _group_then_replicas)
        return runner

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        optimizers = super().setup_optimizers(optimizers)
        if self.mode != "sync":
            if len(optimizers) != 1:
                raise ConfigurationError(
                    f"mode={self.mode!r} synchronises the weights of one optimizer; configure_optimizers returned "
                    f"{len(optimizers)}. Use mode='sync' with several optimizers."
                )
            self._enter_semi_sync(self.module, optimizers[0])
        return optimizers

    def training_step(self, *args: Any) -> Any:
        """Form the step's quorum before its first forward (synchronous mode), then DDP's step."""
        if not self._in_step and self.mode == "sync":
            self._begin_step()
        self._last_batch = args[0] if args else None
        return super().training_step(*args)

    def optimizer_step(self, optimizer: Optimizer, before_step: Callable[[], None],
                       closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Optional[bool]:  # fmt: skip
        """Step only if the quorum commits; ``None`` (not counted as a step) when a peer failed during it."""
        if self.mode == "sync" and not self._commit():
            return None
        return super().optimizer_step(optimizer, before_step, closure, **kwargs)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any) -> None:
        """Written by the live group with the lowest replica rank only (groups never overwrite each other)."""
        if self.is_checkpoint_writer:
            super().save_checkpoint(checkpoint, path)

    def save_checkpoint_async(self, checkpoint: dict[str, Any], path: Any, writer: Any) -> None:
        """As :meth:`save_checkpoint`, written in ``writer``'s thread."""
        if self.is_checkpoint_writer:
            writer.save_file(checkpoint, path)

    def remove_checkpoint(self, path: Any) -> None:
        if self.is_checkpoint_writer:
            super().remove_checkpoint(path)

    def _destroy_process_group(self) -> None:
        self._shutdown_manager()
        super()._destroy_process_group()

