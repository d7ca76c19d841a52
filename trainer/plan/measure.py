"""What one rank holds and what its step does, measured the same way on fake tensors (the plan) and on real ones
(the tests that hold the plan to a real run): parameter/gradient/optimizer bytes, the step's peak from
``torch.distributed._tools``' memory tracker, its collectives and FLOPs."""
from __future__ import annotations

import dataclasses
import itertools
import warnings
from typing import Any, Iterable

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.plan.collectives import Collective, CollectiveLog


def local_bytes(tensor: Tensor) -> int:
    """Bytes of this rank's part of ``tensor`` (a DTensor's local shard; FSDP2's padding included, as its local
    shard is a view of the padded storage)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _unique(tensors: Iterable[Tensor]) -> list[Tensor]:
    return list({id(t): t for t in tensors}.values())


def held_bytes(module: nn.Module, optimizers: list[Optimizer]) -> dict[str, int]:
    """``param_bytes``, ``grad_bytes`` and ``optimizer_bytes`` this rank holds now (gradients: after a backward;
    optimizer state: after a step)."""
    params = _unique(module.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [value for opt in optimizers for state in opt.state.values() for value in state.values()
              if isinstance(value, Tensor) and value.dim() > 0]  # fmt: skip
    return {"param_bytes": sum(map(local_bytes, params)), "grad_bytes": sum(map(local_bytes, grads)),
            "optimizer_bytes": sum(map(local_bytes, _unique(states)))}  # fmt: skip


@dataclasses.dataclass
class StepMeasure:
    """One training step of one rank: its peak memory and what held it, its collectives and FLOPs."""

    peak_bytes: int
    peak_holders: dict[str, int]
    collectives: list[Collective]
    flops: int
    #: False where only the optimizer step ran (a pipeline stage, see :func:`measure_optimizer_step`).
    whole_step: bool = True


def _loss_of(output: Any) -> Tensor:
    if isinstance(output, dict):
        output = output.get("loss")
    if not isinstance(output, Tensor):
        raise TypeError(f"training_step returned {type(output).__name__}; the plan needs the loss tensor (or {{'loss': ...}}).")
    return output


def _tracker(strategy: Any, optimizers: list[Optimizer]) -> Any:
    # torch's module tracker warns on FSDP's redirected forward that its hierarchy "may be messed up"; the plan
    # reads totals, not the hierarchy, so the warning would only alarm the user
    warnings.filterwarnings("ignore", message="The module hierarchy tracking maybe be messed up")
    from torch.distributed._tools import FSDPMemTracker, MemTracker
    from torch.distributed.fsdp import FSDPModule

    runner = strategy.model
    if isinstance(runner, FSDPModule) and len(optimizers) == 1:
        return FSDPMemTracker(runner, optimizers[0])
    tracker = MemTracker()
    tracker.track_external(runner, *optimizers)
    return tracker


def _tensors(data: Any) -> list[Tensor]:
    if isinstance(data, Tensor):
        return [data]
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        return list(itertools.chain.from_iterable(_tensors(d) for d in data))
    return []


def _peak(tracker: Any) -> tuple[int, dict[str, int]]:
    holders: dict[str, int] = {}
    for per_device in tracker.get_tracker_snapshot("peak").values():
        for kind, value in per_device.items():
            name = str(getattr(kind, "value", kind))
            holders[name] = holders.get(name, 0) + int(value)
    return holders.pop("Total", sum(holders.values())), holders


def measure_optimizer_step(strategy: Any, module: nn.Module, optimizers: list[Optimizer], flops: int) -> StepMeasure:
    """A pipeline stage's step without its schedule (whose warm-up reads values its peers send, which a fake
    process group cannot deliver): gradients like the parameters, then the optimizer step, measured. The peak
    leaves out activations; ``flops`` is the caller's estimate."""
    for p in _unique(module.parameters()):
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    tracker = _tracker(strategy, optimizers)
    comms = CollectiveLog(strategy.device_mesh)
    with tracker, comms:
        for optimizer in optimizers:
            strategy.optimizer_step(optimizer, lambda: None)
    total, holders = _peak(tracker)
    return StepMeasure(total, holders, comms.collectives, flops, whole_step=False)


def measure_step(strategy: Any, module: nn.Module, optimizers: list[Optimizer], batch: Any) -> StepMeasure:
    """Run one training step as the Trainer's loop does (``strategy.training_step``, ``backward``,
    ``optimizer_step`` of each optimizer), under the memory tracker, a :class:`CollectiveLog` and a FLOP counter."""
    from torch.utils.flop_counter import FlopCounterMode

    tracker = _tracker(strategy, optimizers)
    if hasattr(tracker, "track_inputs"):
        tracker.track_inputs(tuple(_tensors(batch)))
    comms = CollectiveLog(strategy.device_mesh)
    flops = FlopCounterMode(display=False)
    with tracker, comms, flops:
        loss = _loss_of(strategy.training_step(batch, 0))
        strategy.backward(loss)
        for optimizer in optimizers:
            strategy.optimizer_step(optimizer, lambda: None)
    total, holders = _peak(tracker)
    return StepMeasure(total, holders, comms.collectives, int(flops.get_total_flops()))
