"""``ShardedOptimizer``: ZeRO-1's optimizer. Every rank steps an even slice of every parameter.

Each parameter is split along dim 0 over a 1-D ``DeviceMesh`` of all ranks, as FSDP2 splits it: rank ``r``
holds rows ``[r*c, (r+1)*c)`` with ``c = ceil(rows / world)`` (``torch.chunk``; trailing ranks may hold fewer
rows or none). The slice is a ``DTensor`` with a ``Shard(0)`` placement whose local tensor is a *view* of the
full parameter's rows, so it costs no memory; 0-dim parameters are ``Replicate()`` (every rank steps them).
The user's optimizer class is rebuilt over these slices, so its state (Adam's moments, ...) is sharded too:
about 1/world of it on every rank whatever the sizes of the parameters, where ``ZeroRedundancyOptimizer``
gives whole parameters to ranks (one dominant matrix leaves one rank nearly all the state).

A step: the gradients, already all-reduced by DDP, become ``Shard(0)`` views of their rows; the rebuilt
optimizer steps the slices (in place, so each rank's rows of the full parameter are updated); then every
sharded parameter is all-gathered (``DTensor.full_tensor``) back into the full tensor. The update is the
one DDP's optimizer makes, row for row, and DTensor computes any cross-row reduction an optimizer does
(a norm, a factored moment) over the whole parameter.

The optimizer state is DTensors, so checkpoints reshard through ``torch.distributed.checkpoint`` like FSDP's
(a folder written by ``"fsdp"`` loads here and the other way round), and a full (unsharded) state loads by
each rank keeping its rows.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from strategies.errors import ConfigurationError
from strategies.sharded_checkpoint import is_dtensor


class ShardedOptimizer(Optimizer):
    """Wraps ``optimizer`` (built by the user on the full parameters): its class steps dim-0 slices.

    ``param_groups`` is the user's list (LR schedulers built on ``optimizer`` keep working); ``optim`` is the
    rebuilt optimizer over this rank's slices, whose ``state`` is this rank's share.
    """

    def __init__(self, optimizer: Optimizer, mesh: Any) -> None:
        self.mesh = mesh
        self.full_parameters = [p for group in optimizer.param_groups for p in group["params"]]
        self.slices = [self._slice(p) for p in self.full_parameters]
        it = iter(self.slices)
        groups = [{**_hyperparameters(group), "params": [next(it) for _ in group["params"]]}
                  for group in optimizer.param_groups]  # fmt: skip
        try:
            self.optim = type(optimizer)(groups, **optimizer.defaults)
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                f"strategy='zero1' could not rebuild {type(optimizer).__name__} from its defaults over the parameter "
                f"slices ({err}). Give it constructor arguments matching optimizer.defaults, or use strategy='zero2'."
            ) from err
        super().__init__([{"params": group["params"]} for group in optimizer.param_groups], optimizer.defaults)
        self.param_groups = optimizer.param_groups  # shared: a scheduler changing lr there changes what steps

    def _slice(self, param: Tensor) -> nn.Parameter:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        data = param.detach()
        if data.dim() == 0:
            local, placements = data, [Replicate()]
        else:
            rows = _rows_of(data.shape[0], self.mesh.size(), self.mesh.get_local_rank())
            local, placements = data[rows], [Shard(0)]
        dtensor = DTensor.from_local(local, self.mesh, placements, run_check=False, shape=data.shape,
                                     stride=data.stride())  # fmt: skip
        return nn.Parameter(dtensor, requires_grad=param.requires_grad)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:  # type: ignore[override]
        """Step this rank's slices with the (already averaged) gradients, then gather the full parameters."""
        from torch.distributed.tensor import DTensor

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for mine, group in zip(self.optim.param_groups, self.param_groups):
            mine.update(_hyperparameters(group))
        for param, piece in zip(self.full_parameters, self.slices):
            grad = param.grad
            if grad is not None:
                local = grad if grad.dim() == 0 else grad[_rows_of(grad.shape[0], self.mesh.size(),
                                                                   self.mesh.get_local_rank())]  # fmt: skip
                grad = DTensor.from_local(local, self.mesh, piece.placements, run_check=False, shape=piece.shape,
                                          stride=piece.stride())  # fmt: skip
            piece.grad = grad
        self.optim.step()
        for param, piece in zip(self.full_parameters, self.slices):
            if piece.grad is not None and param.dim():
                param.copy_(piece.full_tensor())
            piece.grad = None  # a view of the full gradient: do not keep it alive past zero_grad
        return loss

    # ------------------------------------------------------------------ state dicts
    def state_dict(self) -> dict[str, Any]:
        """torch's index-keyed format; the state's tensors are this rank's ``DTensor`` slices."""
        state = self.optim.state_dict()
        state["param_groups"] = [{**_hyperparameters(group), "params": saved["params"]}
                                 for group, saved in zip(self.param_groups, state["param_groups"])]  # fmt: skip
        return state

    def full_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` with every slice gathered into the full tensor (collective: every rank calls)."""
        state = self.state_dict()
        state["state"] = {index: {key: value.full_tensor() if is_dtensor(value) else value
                                  for key, value in entry.items()} for index, entry in state["state"].items()}  # fmt: skip
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load an index-keyed state whose tensors are slices (``DTensor``) or full tensors (each rank keeps
        its rows); the groups' hyperparameters go to the shared ``param_groups``."""
        from torch.distributed.tensor import distribute_tensor

        def local(index: int, value: Any) -> Any:
            piece = self.slices[index]
            if is_dtensor(value) or not isinstance(value, Tensor) or value.shape != piece.shape or not piece.dim():
                return value
            return distribute_tensor(value.to(piece.device), self.mesh, piece.placements, src_data_rank=None)

        state = {index: {key: local(index, value) for key, value in entry.items()}
                 for index, entry in state_dict.get("state", {}).items()}  # fmt: skip
        self.optim.load_state_dict({"state": state, "param_groups": state_dict["param_groups"]})
        for mine, loaded in zip(self.param_groups, self.optim.param_groups):
            mine.update(_hyperparameters(loaded))

    def initialised_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` with every entry present (created by a step with zero gradients and learning
        rate, as ``torch.distributed.checkpoint`` does): the shapes a checkpoint's state loads into."""
        from torch.distributed.checkpoint.state_dict import _init_optim_state

        _init_optim_state(self.optim)
        return self.state_dict()

    def __repr__(self) -> str:
        return f"ShardedOptimizer({type(self.optim).__name__}, {len(self.full_parameters)} parameters over {self.mesh.size()} ranks)"


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in group.items() if key != "params"}


def _rows_of(rows: int, world_size: int, rank: int) -> slice:
    """Rank ``rank``'s rows of a dim of ``rows`` split ``torch.chunk``-wise into ``world_size`` (FSDP2's layout)."""
    per_rank = -(-rows // world_size)
    start = min(rows, rank * per_rank)
    return slice(start, min(rows, start + per_rank))
