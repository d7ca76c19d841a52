"""``ShardedOptimizer``: ZeRO-1's optimizer. Every rank steps an even slice of every parameter.

Each parameter is split along dim 0 over a 1-D ``DeviceMesh`` of all ranks, as FSDP2 splits it: rank ``r``
holds rows ``[r*c, (r+1)*c)`` with ``c = ceil(rows / world)`` (``torch.chunk``; trailing ranks may hold fewer
rows or none). The slice is a ``DTensor`` with a ``Shard(0)`` placement whose local tensor is a *view* of the
full parameter's rows, so it costs no memory; 0-dim parameters are ``Replicate()`` (every rank steps them).
The user's optimizer class is rebuilt over these slices, so its state (Adam's moments, ...) is sharded too:
about 1/world of it on every rank whatever the sizes of the parameters, where ``ZeroRedundancyOptimizer``
gives whole parameters to ranks (one dominant matrix leaves one rank nearly all the state).

A step: the gradients, already all-reduced by DDP, become ``Shard(0)`` views of their rows; the rebuilt
optimizer steps the slices (in place, so each rank's rows of the full parameter are updated); then the
updated slices are all-gathered back into the full parameters, one ``all_gather_into_tensor`` per bucket of
up to 32 MiB of parameters (per-parameter ``DTensor.full_tensor`` calls would cost one collective each). The
update is the one DDP's optimizer makes, row for row, for element-wise optimizers (Adam, AdamW, SGD, RMSprop,
Adagrad, ...); those that compute over whole parameters (Adafactor, Muon, LBFGS, SparseAdam) are refused.

The optimizer state is DTensors, so checkpoints reshard through ``torch.distributed.checkpoint`` like FSDP's
(a folder written by ``"fsdp"`` loads here and the other way round), and a full (unsharded) state loads by
each rank keeping its rows.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.checkpoint.sharded_checkpoint import is_dtensor


BUCKET_BYTES = 32 * 2**20  # full-parameter bytes gathered per collective (DDP buckets gradients by 25 MiB)
_WHOLE_PARAMETER = ("Adafactor", "LBFGS", "Muon", "SparseAdam")  # torch.optim classes a row slice would change


class ShardedOptimizer(Optimizer):
    """Wraps ``optimizer`` (built by the user on the full parameters): its class steps dim-0 slices.

    ``param_groups`` is the user's list (LR schedulers built on ``optimizer`` keep working); ``optim`` is the
    rebuilt optimizer over this rank's slices, whose ``state`` is this rank's share.
    """

    def __init__(self, optimizer: Optimizer, mesh: Any, bucket_bytes: int = BUCKET_BYTES) -> None:
        whole = tuple(getattr(torch.optim, name) for name in _WHOLE_PARAMETER if hasattr(torch.optim, name))
        if isinstance(optimizer, whole):
            raise ConfigurationError(
                f"strategy='zero1' steps row slices of every parameter, but {type(optimizer).__name__} computes over "
                "whole parameters (factored moments, orthogonalised updates, line searches or sparse gradients). "
                "Use strategy='ddp', or an element-wise optimizer (Adam, AdamW, SGD, ...)."
            )
        self.mesh = mesh
        self.full_parameters = [p for group in optimizer.param_groups for p in group["params"]]
        world, rank = mesh.size(), mesh.get_local_rank()
        self._rows = [chunk_rows(p.shape[0], world, rank) if p.dim() else None for p in self.full_parameters]
        self.slices = [self._slice(p, rows) for p, rows in zip(self.full_parameters, self._rows)]
        self._buckets = _gather_buckets(self.full_parameters, self.slices, world, bucket_bytes)
        it = iter(self.slices)
        groups = [{**_hyperparameters(group), "params": [next(it) for _ in group["params"]]}
                  for group in optimizer.param_groups]  # fmt: skip
        try:
            self.optim = type(optimizer)(groups, **_constructor_arguments(optimizer))
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                f"strategy='zero1' could not rebuild {type(optimizer).__name__} from its defaults over the parameter "
                f"slices ({err}). Give it constructor arguments matching optimizer.defaults, or use strategy='zero2'."
            ) from err
        super().__init__([{"params": group["params"]} for group in optimizer.param_groups], optimizer.defaults)
        self.param_groups = optimizer.param_groups  # shared: a scheduler changing lr there changes what steps

    def _slice(self, param: Tensor, rows: Optional[slice]) -> nn.Parameter:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        data = param.detach()
        local, placements = (data, [Replicate()]) if rows is None else (data[rows], [Shard(0)])
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
        for param, piece, rows in zip(self.full_parameters, self.slices, self._rows):
            grad = param.grad
            if grad is not None:
                grad = DTensor.from_local(grad if rows is None else grad[rows], self.mesh, piece.placements,
                                          run_check=False, shape=piece.shape, stride=piece.stride())  # fmt: skip
            piece.grad = grad
        self.optim.step()
        for piece in self.slices:
            piece.grad = None  # a view of the full gradient: do not keep it alive past zero_grad
        for bucket in self._buckets:
            bucket.gather(self.mesh)
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


def _constructor_arguments(optimizer: Optimizer) -> dict[str, Any]:
    """``optimizer.defaults`` that its class's constructor takes (AdamW's defaults hold Adam's
    ``decoupled_weight_decay``, which AdamW sets itself; each group keeps it)."""
    parameters = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(optimizer.defaults)
    return {key: value for key, value in optimizer.defaults.items() if key in parameters}


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in group.items() if key != "params"}


class _Bucket:
    """Sliced parameters of one dtype and device gathered by one ``all_gather_into_tensor``: rank ``k`` sends
    its slices back to back, each padded to ``ceil(rows / world)`` rows, so in what arrives block ``k`` of a
    parameter's span is rank ``k``'s rows, in order."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.entries: list[tuple[Tensor, Tensor, int, int]] = []  # (full parameter, its slice, offset, span)
        self.numel = 0

    def add(self, param: Tensor, piece: Tensor) -> None:
        span = -(-param.shape[0] // self.world_size) * (param.numel() // param.shape[0])
        self.entries.append((param, piece, self.numel, span))
        self.numel += span

    def gather(self, mesh: Any) -> None:
        import torch.distributed as dist

        first = self.entries[0][0]
        send = first.new_empty(self.numel)
        for _, piece, offset, _ in self.entries:
            local = piece.to_local()
            send[offset : offset + local.numel()].copy_(local.reshape(-1))
        received = first.new_empty(self.world_size * self.numel)
        dist.all_gather_into_tensor(received, send, group=mesh.get_group())
        received = received.view(self.world_size, self.numel)
        for param, _, offset, span in self.entries:
            rows = param.shape[0]
            per_rank = span * rows // param.numel()
            blocks = received[:, offset : offset + span].view(self.world_size, per_rank, -1)
            target = param.view(rows, -1)
            whole = rows // per_rank  # ranks holding a full block; the next one holds the rest
            target[: whole * per_rank].view(whole, per_rank, -1).copy_(blocks[:whole])
            if whole * per_rank < rows:
                target[whole * per_rank :].copy_(blocks[whole, : rows - whole * per_rank])


def _gather_buckets(params: list[Tensor], slices: list[Tensor], world_size: int, bucket_bytes: int) -> list[_Bucket]:
    """Buckets of at most ``bucket_bytes`` of full parameters (one parameter may exceed it alone), one dtype
    and device each; 0-dim parameters are replicated and need no gathering."""
    buckets: dict[tuple[torch.dtype, torch.device], list[_Bucket]] = {}
    for param, piece in zip(params, slices):
        if param.dim() == 0 or param.numel() == 0:
            continue
        if not param.is_contiguous():
            raise ConfigurationError(
                f"strategy='zero1' gathers parameters row by row and needs them contiguous; one has shape "
                f"{tuple(param.shape)} and strides {param.stride()} (channels_last?). Use strategy='zero2' or 'fsdp'."
            )
        kind = buckets.setdefault((param.dtype, param.device), [_Bucket(world_size)])
        if kind[-1].entries and (kind[-1].numel * world_size + param.numel()) * param.element_size() > bucket_bytes:
            kind.append(_Bucket(world_size))
        kind[-1].add(param, piece)
    return [bucket for kind in buckets.values() for bucket in kind]


def chunk_rows(rows: int, parts: int, index: int) -> slice:
    """The rows part ``index`` holds when ``rows`` are split ``torch.chunk``-wise into ``parts``: ``ceil(rows /
    parts)`` each, trailing parts fewer or none (DTensor's ``Shard`` and FSDP2's layout)."""
    per_part = -(-rows // parts)
    start = min(rows, index * per_part)
    return slice(start, min(rows, start + per_part))
