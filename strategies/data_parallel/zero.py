"""``ZeroStrategy(stage=1|2)``: ZeRO-style data parallelism. ``strategy="zero1"`` and ``"zero2"``.

- **Stage 1** (``Zero1Strategy``): DDP as usual (full parameters and gradients on every rank, gradients
  all-reduced), but the optimizer is a :class:`~trainer.strategies.data_parallel.sharded_optimizer.ShardedOptimizer` around the
  user's: each rank keeps the state of, and steps, an even dim-0 slice of every parameter (a ``DTensor``
  ``Shard(0)`` over all ranks, as FSDP2 lays parameters out), then the slices are all-gathered. Optimizer-state
  memory drops to 1/world on every rank (Adam: 8 bytes per parameter become 8/world), whatever the sizes.
- **Stage 2** (``Zero2Strategy``): FSDP2 with ``reshard_after_forward=False`` (SHARD_GRAD_OP): gradients and
  optimizer state are sharded, parameters are gathered once per step and kept from forward through backward.
  See :mod:`trainer.strategies.data_parallel.fsdp`.

``ZeroStrategy(stage=...)`` returns the class for that stage, so ``isinstance(s, ZeroStrategy)`` holds for both.

Stage 1 and LR schedulers: the user's optimizer was built in ``configure_optimizers`` and the schedulers hold
it. The sharded optimizer is rebuilt from its class, ``defaults`` and parameter groups, and shares the user
optimizer's ``param_groups`` list, so a scheduler changing ``lr`` there changes what ZeRO steps with.
"""
from __future__ import annotations

import datetime
from typing import Any, Optional, Union

from torch.optim import Optimizer

from trainer.strategies.data_parallel.ddp import DDPStrategy
from trainer.strategies.launch.environments import ClusterEnvironment
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.data_parallel.fsdp import FSDPStrategy
from trainer.strategies.parallel import ParallelStrategy
from trainer.strategies.precision import Precision
from trainer.strategies.checkpoint.sharded_checkpoint import (
    ShardedCheckpointIO,
    check_state_dict_type,
    optimizer_state_by_index,
    optimizer_state_by_name,
    parameter_names,
)
from trainer.strategies.data_parallel.sharded_optimizer import ShardedOptimizer


class ZeroStrategy(ParallelStrategy):
    """``ZeroStrategy(stage=1)`` shards optimizer state; ``stage=2`` also gradients. Other keyword arguments go to
    :class:`Zero1Strategy` (those of ``DDPStrategy``) or :class:`Zero2Strategy` (those of ``FSDPStrategy``)."""

    def __new__(cls, *args: Any, stage: int = 1, **kwargs: Any) -> "ZeroStrategy":
        if cls is ZeroStrategy:
            if stage not in (1, 2):
                raise ConfigurationError(
                    f"ZeroStrategy(stage={stage!r}) is not supported. Use stage=1 (optimizer state sharded) or 2 "
                    "(gradients too); for stage 3 (parameters too) use FSDPStrategy (strategy='fsdp')."
                )
            cls = Zero1Strategy if stage == 1 else Zero2Strategy
        return super().__new__(cls)


class Zero2Strategy(ZeroStrategy, FSDPStrategy):
    """ZeRO stage 2: ``FSDPStrategy(reshard_after_forward=False)``."""

    strategy_name = "zero2"

    def __init__(self, stage: int = 2, **kwargs: Any) -> None:
        if kwargs.pop("reshard_after_forward", False):
            raise ConfigurationError("ZeRO stage 2 keeps parameters gathered until backward; for reshard_after_forward="
                                     "True (stage 3) use FSDPStrategy.")  # fmt: skip
        FSDPStrategy.__init__(self, reshard_after_forward=False, **kwargs)


class Zero1Strategy(ShardedCheckpointIO, ZeroStrategy, DDPStrategy):
    """ZeRO stage 1: DDP with each optimizer rebuilt as a :class:`~trainer.strategies.data_parallel.sharded_optimizer.ShardedOptimizer`
    (every rank steps and keeps the state of an even dim-0 slice of every parameter).

    Args:
        state_dict_type: ``"sharded"`` (checkpoint folders; each rank writes its slices of the optimizer state,
            the replicated weights are written once) or ``"full"`` (the optimizer state is gathered on rank 0).
        **kwargs: as for ``DDPStrategy`` (``find_unused_parameters``, ``timeout``, ``process_group_backend``, ...).
    """

    strategy_name = "zero1"
    is_sharded = True

    def __init__(
        self,
        stage: int = 1,
        state_dict_type: str = "sharded",
        timeout: Union[None, float, datetime.timedelta] = None,
        process_group_backend: Optional[str] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        precision: Optional[Precision] = None,
        **ddp_kwargs: Any,
    ) -> None:
        DDPStrategy.__init__(self, "popen", timeout=timeout, process_group_backend=process_group_backend,
                             cluster_environment=cluster_environment, precision=precision, **ddp_kwargs)  # fmt: skip
        self.strategy_name = "zero1"
        self.state_dict_type = check_state_dict_type(state_dict_type)
        self._users: dict[int, Optimizer] = {}  # id(sharded wrapper) -> the user's optimizer it replaced
        self._sharded: list[ShardedOptimizer] = []

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        """Replace each optimizer by a :class:`ShardedOptimizer` of the same class, options and groups."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.optim import ZeroRedundancyOptimizer

        mesh = init_device_mesh(self.root_device.type, (self.world_size,))
        wrapped: list[Optimizer] = []
        self._users = {}
        for user in optimizers:
            if isinstance(user, ZeroRedundancyOptimizer):
                raise ConfigurationError(
                    "configure_optimizers returned a ZeroRedundancyOptimizer, but strategy='zero1' shards the optimizer "
                    "itself (evenly, by rows of every parameter). Return the plain optimizer (e.g. torch.optim.AdamW), "
                    "or use strategy='ddp' to keep your ZeroRedundancyOptimizer."
                )
            sharded = user if isinstance(user, ShardedOptimizer) else ShardedOptimizer(user, mesh)
            self._users[id(sharded)] = user
            wrapped.append(sharded)
        self._sharded = [opt for opt in wrapped if isinstance(opt, ShardedOptimizer)]
        return super().setup_optimizers(wrapped)

    def optimizer_step(self, optimizer: Optimizer, before_step: Any, closure: Any = None, **kwargs: Any) -> bool:
        stepped = super().optimizer_step(optimizer, before_step, closure, **kwargs)
        user = self._users.get(id(optimizer))
        if user is not None:
            user._opt_called = True  # what LR schedulers check to warn about step order; ZeRO stepped for `user`
        return stepped

    # ------------------------------------------------------------------ state dicts
    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """Sharded: this rank's slices (DTensors), keyed by parameter name. Full: gathered, in torch's index-keyed
        format, on rank 0 (every rank must call; others get ``{}``)."""
        if not isinstance(optimizer, ShardedOptimizer):
            return super().optimizer_state_dict(optimizer)
        if self.state_dict_type == "full":
            state = optimizer.full_state_dict()
            return state if self.is_global_zero else {}
        return optimizer_state_by_name(optimizer.state_dict(), parameter_names(self.module, optimizer))

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a sharded (name-keyed DTensors, from any world size or strategy) or full state; each rank keeps
        its slices."""
        if not isinstance(optimizer, ShardedOptimizer):
            return super().load_optimizer_state_dict(optimizer, state)
        optimizer.load_state_dict(optimizer_state_by_index(state, parameter_names(self.module, optimizer)))

    def checkpoint_templates(self, sections: dict[str, Any]) -> dict[str, Any]:
        """The replicated weights load in place; the optimizer state into this rank's slices."""
        templates: dict[str, Any] = {"state_dict": self.module.state_dict()}
        if self._sharded and "optimizer_states" in sections:
            templates["optimizer_states"] = [
                optimizer_state_by_name(opt.initialised_state_dict(), parameter_names(self.module, opt))
                for opt in self._sharded
            ]
        return templates

    def keep_untemplated(self, key: str) -> bool:
        """Without optimizers (evaluating) no optimizer entry is read."""
        return bool(self._sharded) or key.split("/")[0] != "optimizer_states"

    def teardown(self) -> None:
        self._sharded = []
        super().teardown()
