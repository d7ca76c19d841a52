"""``strategy="ft_hsdp"`` (``FaultTolerantHSDPStrategy``): FSDP2 inside each replica group, torchft across groups.

Hybrid sharding as torchtitan wires torchft: the group's ranks shard the model (FSDP2's reduce-scatter averages
the gradient inside the group), and each rank's gradient shard is then averaged with the same rank's shard of
the other groups in the step's quorum, through FSDP2's all-reduce hook on torchft's manager (the ``dp_replicate``
dimension, made fault tolerant). The groups must have the same number of ranks. Healing sends each rank's shards
to the same rank of the restarted group. See :mod:`.fault_tolerant` for what a step means when a group is missing.
"""
from __future__ import annotations

import datetime
from typing import Any, Callable, Optional, Union

from torch import nn
from torch.optim import Optimizer

from trainer.strategies.data_parallel.fsdp import FSDPStrategy, WrapPolicy
from trainer.strategies.data_parallel.replica_groups import ReplicaGroupMember
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.launch.environments import ClusterEnvironment
from trainer.strategies.precision import Precision


class FaultTolerantHSDPStrategy(ReplicaGroupMember, FSDPStrategy):
    """FSDP2 inside replica groups that survive each other's failures (torchft), synchronous mode only.

    Args:
        min_replicas, lighthouse, replica_id, num_replica_groups, ft_timeout, quorum_timeout, connect_timeout:
            see :class:`~trainer.strategies.data_parallel.replica_groups.ReplicaGroupMember`.
        auto_wrap_policy, reshard_after_forward, mixed_precision, state_dict_type, timeout, process_group_backend,
            cluster_environment, precision: as :class:`FSDPStrategy`, inside the group.
    """

    strategy_name = "ft_hsdp"

    def __init__(
        self,
        min_replicas: int = 1,
        lighthouse: Optional[str] = None,
        replica_id: Optional[int] = None,
        num_replica_groups: Optional[int] = None,
        ft_timeout: float = 30.0,
        quorum_timeout: float = 120.0,
        connect_timeout: float = 30.0,
        auto_wrap_policy: WrapPolicy = None,
        reshard_after_forward: bool = True,
        mixed_precision: Any = None,
        state_dict_type: str = "sharded",
        timeout: Union[None, float, datetime.timedelta] = None,
        process_group_backend: Optional[str] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        precision: Optional[Precision] = None,
    ) -> None:
        super().__init__(auto_wrap_policy=auto_wrap_policy, reshard_after_forward=reshard_after_forward,
                         mixed_precision=mixed_precision, state_dict_type=state_dict_type, timeout=timeout,
                         process_group_backend=process_group_backend, cluster_environment=cluster_environment,
                         precision=precision)  # fmt: skip
        self.strategy_name = "ft_hsdp"
        self._init_replicas(min_replicas, lighthouse, replica_id, num_replica_groups, ft_timeout, quorum_timeout,
                            connect_timeout)  # fmt: skip

    def setup_environment(self) -> None:
        """The group's process group, then this group's torchft manager."""
        super().setup_environment()
        if self.manager is None:
            self._start_manager()

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Shard inside the group; every FSDP unit's reduced gradient shard is then averaged across the groups."""
        from torch.distributed.fsdp import FSDPModule

        root = super().setup_module(module)

        def across_groups(reduced: Any) -> None:
            self.manager.allreduce(reduced).wait()  # an error is recorded (the step will not commit), not raised

        for unit in root.modules():
            if isinstance(unit, FSDPModule):
                unit.set_all_reduce_hook(across_groups)
        return root

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        if not optimizers:
            raise ConfigurationError("strategy='ft_hsdp' needs an optimizer (configure_optimizers returned none).")
        return super().setup_optimizers(optimizers)

    def training_step(self, *args: Any) -> Any:
        """Form the step's quorum before its first forward, then FSDP's step."""
        if not self._in_step:
            self._begin_step()
        self._last_batch = args[0] if args else None
        return super().training_step(*args)

    def optimizer_step(self, optimizer: Optimizer, before_step: Callable[[], None],
                       closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Optional[bool]:  # fmt: skip
        """Step only if the quorum commits; ``None`` (not counted as a step) when a peer failed during it."""
        if not self._commit():
            return None
        return super().optimizer_step(optimizer, before_step, closure, **kwargs)

    # A healing peer gets this rank's own shards (no collective: see ReplicaGroupMember._peer_state).
    def module_state_dict(self, module: Optional[nn.Module] = None) -> dict[str, Any]:
        """As FSDP's; while healing a peer, this rank's ``module.state_dict()`` (its shards, no collective)."""
        if self.for_peer:
            return (self.module if module is None else module).state_dict()
        return super().module_state_dict(module)

    def load_module_state_dict(self, state_dict: dict[str, Any], strict: bool = True,
                               module: Optional[nn.Module] = None) -> Any:  # fmt: skip
        """As FSDP's; while healing from a peer, this rank's shards straight into the module."""
        if self.for_peer:
            return (self.module if module is None else module).load_state_dict(state_dict, strict=strict)
        return super().load_module_state_dict(state_dict, strict, module)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """As FSDP's; while healing a peer, the optimizer's own state dict (this rank's shards)."""
        return optimizer.state_dict() if self.for_peer else super().optimizer_state_dict(optimizer)

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """As FSDP's; while healing from a peer, straight into the optimizer."""
        if self.for_peer:
            optimizer.load_state_dict(state)
        else:
            super().load_optimizer_state_dict(optimizer, state)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any) -> None:
        """Written by the live group with the lowest replica rank only (every rank of it: sharded folders)."""
        if self.is_checkpoint_writer:
            super().save_checkpoint(checkpoint, path)

    def save_checkpoint_async(self, checkpoint: dict[str, Any], path: Any, writer: Any) -> None:
        """As :meth:`save_checkpoint`, in ``writer``'s thread."""
        if self.is_checkpoint_writer:
            super().save_checkpoint_async(checkpoint, path, writer)

    def remove_checkpoint(self, path: Any) -> None:
        if self.is_checkpoint_writer:
            super().remove_checkpoint(path)

    def _destroy_process_group(self) -> None:
        self._shutdown_manager()
        super()._destroy_process_group()
