"""``ZeroStrategy(stage=1|2)``: ZeRO-style data parallelism. ``strategy="zero1"`` and ``"zero2"``.

- **Stage 1** (``Zero1Strategy``): DDP as usual (full parameters and gradients on every rank, gradients
  all-reduced), but the optimizer is a ``torch.distributed.optim.ZeroRedundancyOptimizer`` around the user's:
  each rank keeps the state of, and steps, only its partition of the parameters, then broadcasts the updated
  parameters. Optimizer-state memory drops to about 1/world (Adam: 8 bytes per parameter become 8/world).
- **Stage 2** (``Zero2Strategy``): FSDP2 with ``reshard_after_forward=False`` (SHARD_GRAD_OP): gradients and
  optimizer state are sharded, parameters are gathered once per step and kept from forward through backward.
  See :mod:`strategies.fsdp`.

``ZeroStrategy(stage=...)`` returns the class for that stage, so ``isinstance(s, ZeroStrategy)`` holds for both.

Stage 1 and LR schedulers: the user's optimizer was built in ``configure_optimizers`` and the schedulers hold
it. The ZeRO wrapper is rebuilt from its class, ``defaults`` and parameter groups, and shares the user
optimizer's ``param_groups`` list, so a scheduler changing ``lr`` there changes what ZeRO steps with.
"""
from __future__ import annotations

import datetime
from typing import Any, Optional, Union

from torch.optim import Optimizer

from strategies.ddp import DDPStrategy
from strategies.environments import ClusterEnvironment
from strategies.errors import ConfigurationError
from strategies.fsdp import FSDPStrategy
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision
from strategies.sharded_checkpoint import (
    ShardedCheckpointIO,
    check_state_dict_type,
    optimizer_parameters,
    optimizer_state_by_index,
    parameter_names,
)


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
    """ZeRO stage 1: DDP with each optimizer wrapped in ``ZeroRedundancyOptimizer``.

    Args:
        state_dict_type: ``"sharded"`` (checkpoint folders; each rank writes the optimizer state it owns, the
            replicated weights are written once) or ``"full"`` (the optimizer state is consolidated on rank 0).
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
        self._users: dict[int, Optimizer] = {}  # id(ZeRO wrapper) -> the user's optimizer it replaced
        self._owned: Optional[set[str]] = None  # parameters whose optimizer state this rank holds (None: no optimizer)

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        """Replace each optimizer by a ``ZeroRedundancyOptimizer`` of the same class, options and groups."""
        from torch.distributed.optim import ZeroRedundancyOptimizer

        wrapped = []
        self._users = {}
        for user in optimizers:
            if isinstance(user, ZeroRedundancyOptimizer):
                wrapped.append(user)
                continue
            groups = [dict(group) for group in user.param_groups]
            try:
                zero = ZeroRedundancyOptimizer(groups, optimizer_class=type(user), **user.defaults)
            except (TypeError, ValueError) as err:
                raise ConfigurationError(
                    f"strategy='zero1' could not rebuild {type(user).__name__} for ZeroRedundancyOptimizer from its "
                    f"defaults ({err}). Return a ZeroRedundancyOptimizer from configure_optimizers yourself, or use "
                    "strategy='zero2'."
                ) from err
            zero.param_groups = user.param_groups  # schedulers built on `user` now drive ZeRO's hyperparameters
            self._users[id(zero)] = user
            wrapped.append(zero)
        self._owned = set()
        for zero in wrapped:
            names = dict(zip(map(id, optimizer_parameters(zero)), parameter_names(self.module, zero)))
            self._owned.update(names[id(p)] for group in zero.optim.param_groups for p in group["params"])
        return super().setup_optimizers(wrapped)

    def optimizer_step(self, optimizer: Optimizer, before_step: Any, closure: Any = None) -> bool:
        stepped = super().optimizer_step(optimizer, before_step, closure)
        user = self._users.get(id(optimizer))
        if user is not None:
            user._opt_called = True  # what LR schedulers check to warn about step order; ZeRO stepped for `user`
        return stepped

    # ------------------------------------------------------------------ state dicts
    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """Sharded: the state of the parameters this rank owns, keyed by name. Full: consolidated on rank 0
        (every rank must call; others get ``{}``)."""
        local = getattr(optimizer, "optim", None)
        if local is None:  # not a ZeRO optimizer
            return super().optimizer_state_dict(optimizer)
        if self.state_dict_type == "full":
            optimizer.consolidate_state_dict(to=0)
            return optimizer.state_dict() if self.is_global_zero else {}
        names = dict(zip(map(id, optimizer_parameters(optimizer)), parameter_names(self.module, optimizer)))
        return {
            "state": {names[id(p)]: dict(state) for p, state in local.state.items()},
            "param_groups": [{**{k: v for k, v in group.items() if k != "params"},
                              "params": [names[id(p)] for p in group["params"]]} for group in optimizer.param_groups],
        }  # fmt: skip

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a full or a sharded (any world size) state; each rank keeps the entries of its partition."""
        if getattr(optimizer, "optim", None) is None:
            return super().load_optimizer_state_dict(optimizer, state)
        state = optimizer_state_by_index(state, parameter_names(self.module, optimizer))  # no-op when by index
        shared = optimizer.param_groups
        optimizer.load_state_dict(state)  # ZeRO keeps this rank's entries; it replaces param_groups with copies
        for mine, loaded in zip(shared, optimizer.param_groups):
            mine.update({k: v for k, v in loaded.items() if k != "params"})
        optimizer.param_groups = shared

    def checkpoint_templates(self, sections: dict[str, Any]) -> dict[str, Any]:
        """The replicated weights load in place; optimizer entries are read for the parameters this rank owns."""
        return {"state_dict": self.module.state_dict()}

    def keep_untemplated(self, key: str) -> bool:
        """Optimizer entries are read for the parameters this rank owns only (none while evaluating)."""
        parts = key.split("/")
        if parts[0] != "optimizer_states":
            return True
        if self._owned is None:
            return False
        return len(parts) < 4 or parts[2] != "state" or parts[3] in self._owned

    def teardown(self) -> None:
        self._owned = None
        super().teardown()
