"""Memory planner: how many bytes each device holds for a module under each strategy, before you run it.

``estimate(module, strategy="fsdp", world_size=8, precision="bf16-mixed", optimizer="adam")`` returns a
:class:`MemoryEstimate` with one :class:`DeviceMemory` per rank (per device for ``"model_parallel"``):

- ``parameters``, ``gradients``, ``optimizer_state``: the bytes of the tensors that persist between steps,
  computed exactly as the strategies lay them out: DDP and ZeRO-1 replicate parameters and gradients; ZeRO-1
  gives each rank the optimizer state of its partition (``ZeroRedundancyOptimizer``'s greedy split by size);
  ZeRO-2 and FSDP give rank ``r`` the ``r``-th ``torch.chunk`` of every parameter along dim 0 (FSDP2's
  layout) for parameters, gradients and state; model parallel puts each tensor on its device-map device.
  Parameters and gradients are float32 under "32-true" and the mixed precisions (master weights), half
  under "16-true"/"bf16-true"; optimizer state has the parameters' dtype, plus Adam's 4-byte ``step``.
- ``working``: rough transient memory: DDP/ZeRO-1 gradient buckets (one more copy of the gradients), the
  gathered parameters of ZeRO-2 (all, in the compute dtype) and FSDP (the two largest units: one computing,
  one prefetched).
- ``activations``: rough, only with ``example_input`` (one device's micro-batch): the bytes of every leaf
  module's output, halved for 16-bit precisions. Activation checkpointing, fused kernels and the autograd
  graph's own saves make the real figure differ; measure with ``MemoryMonitor`` for the truth.

:func:`report` prints a table for every strategy and recommends the one with the least communication that
fits a device. ``trainer estimate-memory module.py:Class --world-size 8 --precision bf16-mixed``
(:mod:`trainer.cli.estimate_memory`) builds the module on the ``meta`` device and prints the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from strategies.device_map import format_bytes, parse_bytes, plan_device_map, tensor_devices
from strategies.errors import ConfigurationError
from strategies.fsdp import wrap_targets
from strategies.precision import canonical_precision

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "model_parallel")
HEADROOM = 0.9  # a plan "fits" when it needs at most this share of a device (allocator, buffers, fragmentation)
_HALF = {"16-true": torch.float16, "bf16-true": torch.bfloat16}
_FIELDS = ("parameters", "gradients", "optimizer_state", "working", "activations")


@dataclass
class DeviceMemory:
    """Bytes on one device (``activations`` is ``None`` when no example input was given)."""

    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    working: int = 0
    activations: Optional[int] = None

    @property
    def total(self) -> int:
        """Everything above, added."""
        return self.parameters + self.gradients + self.optimizer_state + self.working + (self.activations or 0)


@dataclass
class MemoryEstimate:
    """One strategy's plan: ``devices[i]`` is rank ``i`` (or device ``i`` for model parallel)."""

    strategy: str
    world_size: int
    precision: str
    optimizer: str
    devices: list[DeviceMemory] = field(default_factory=list)

    @property
    def peak(self) -> DeviceMemory:
        """The device that needs the most."""
        return max(self.devices, key=lambda d: d.total)

    def fits(self, device_memory: Union[int, str]) -> bool:
        """Whether the busiest device stays within ``HEADROOM`` of ``device_memory``."""
        return self.peak.total <= HEADROOM * parse_bytes(device_memory, "device_memory")


# ---------------------------------------------------------------------------------------------- optimizers
def optimizer_states(optimizer: Any) -> tuple[int, int, str]:
    """(full-size states per parameter, bytes of scalar state per parameter, name) for an optimizer spec:
    ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd_momentum"``, ``"rmsprop"``, ``"adagrad"``, or an optimizer."""
    if isinstance(optimizer, torch.optim.Optimizer):
        defaults = optimizer.defaults
        name = type(optimizer).__name__.lower()
        if name == "sgd":
            name = "sgd_momentum" if defaults.get("momentum", 0) else "sgd"
        extra = int(bool(defaults.get("amsgrad"))) + int(bool(defaults.get("centered")))
        if name == "rmsprop":
            extra += int(bool(defaults.get("momentum", 0)))
    else:
        name, extra = str(optimizer).lower().replace("-", "_").replace("+", "_"), 0
    table = {"adam": (2, 4), "adamw": (2, 4), "sgd": (0, 0), "sgd_momentum": (1, 0), "rmsprop": (1, 4),
             "adagrad": (1, 4)}  # fmt: skip
    if name not in table:
        raise ConfigurationError(
            f"optimizer={optimizer!r} is not known to the memory planner. Use one of {sorted(table)} or pass an "
            "optimizer instance of those classes."
        )
    states, scalar = table[name]
    return states + extra, scalar, name


# ---------------------------------------------------------------------------------------------- layouts
def _rows(param: Tensor) -> int:
    return param.shape[0] if param.dim() else 1


def shard_numel(param: Tensor, world_size: int, rank: int) -> int:
    """Elements of ``param`` on ``rank`` under FSDP2 (``torch.chunk`` along dim 0; trailing ranks may get none)."""
    rows = _rows(param)
    per_rank = math.ceil(rows / world_size)
    mine = max(0, min(per_rank, rows - rank * per_rank))
    return mine * (param.numel() // rows if rows else 0)


def zero_partition(groups: Sequence[Sequence[Tensor]], world_size: int) -> dict[int, int]:
    """``id(param) -> rank`` as ``ZeroRedundancyOptimizer`` assigns them: per group, largest first, each to
    the rank with the fewest elements so far (ties to the lowest rank)."""
    sizes = [0] * world_size
    owner: dict[int, int] = {}
    for group in groups:
        for param in sorted(group, key=lambda p: p.numel(), reverse=True):
            rank = sizes.index(min(sizes))
            owner[id(param)] = rank
            sizes[rank] += param.numel()
    return owner


def _unique_parameters(module: nn.Module) -> list[tuple[str, Tensor]]:
    return list(module.named_parameters())


def _itemsize(param: Tensor, precision: str) -> int:
    dtype = _HALF.get(precision) or (torch.float64 if precision == "64-true" else param.dtype)
    return torch.empty((), dtype=dtype).element_size()


# ---------------------------------------------------------------------------------------------- estimate
def estimate(
    module: nn.Module,
    strategy: str = "ddp",
    world_size: int = 1,
    precision: Any = "32-true",
    optimizer: Any = "adam",
    example_input: Any = None,
    auto_wrap_policy: Any = None,
    device_map: Any = "auto",
    max_memory: Any = None,
    param_groups: Optional[Sequence[Sequence[Tensor]]] = None,
) -> MemoryEstimate:
    """Per-device bytes of ``module`` trained with ``strategy`` on ``world_size`` ranks (devices for
    ``"model_parallel"``). ``param_groups`` (lists of parameters) matter for ZeRO-1's partition; by default one
    group holds every parameter. ``auto_wrap_policy`` is FSDP's; ``device_map``/``max_memory`` model parallel's."""
    if strategy not in STRATEGIES:
        raise ConfigurationError(f"estimate(strategy={strategy!r}): use one of {', '.join(STRATEGIES)}.")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigurationError(f"estimate(world_size={world_size!r}) must be a positive int.")
    precision = canonical_precision(precision)
    states, scalar, optimizer_name = optimizer_states(optimizer)
    params = _unique_parameters(module)
    trainable = [(n, p) for n, p in params if p.requires_grad]
    devices = [DeviceMemory() for _ in range(world_size)]
    size = {id(p): _itemsize(p, precision) for _, p in params}

    if strategy in ("ddp", "zero1"):
        full = sum(p.numel() * size[id(p)] for _, p in params)
        grads = sum(p.numel() * size[id(p)] for _, p in trainable)
        groups = param_groups or [[p for _, p in trainable]]
        owner = zero_partition(groups, world_size) if strategy == "zero1" else None
        for rank, device in enumerate(devices):
            device.parameters, device.gradients, device.working = full, grads, grads
            mine = [p for _, p in trainable if owner is None or owner[id(p)] == rank]
            device.optimizer_state = sum(states * p.numel() * size[id(p)] + scalar for p in mine)
    elif strategy in ("zero2", "fsdp"):
        compute = 2 if precision != "32-true" and precision != "64-true" else None
        for rank, device in enumerate(devices):
            device.parameters = sum(shard_numel(p, world_size, rank) * size[id(p)] for _, p in params)
            device.gradients = sum(shard_numel(p, world_size, rank) * size[id(p)] for _, p in trainable)
            device.optimizer_state = sum(states * shard_numel(p, world_size, rank) * size[id(p)] + scalar
                                         for _, p in trainable)  # fmt: skip
            device.working = _gathered_bytes(module, strategy, auto_wrap_policy, size, compute)
    else:
        devices = _model_parallel(module, world_size, device_map, max_memory, size, states, scalar)
    if example_input is not None:
        _add_activations(module, example_input, precision, strategy, devices, device_map, max_memory, world_size)
    return MemoryEstimate(strategy, world_size, precision, optimizer_name, devices)


def _gathered_bytes(module: nn.Module, strategy: str, policy: Any, size: dict[int, int], compute: Optional[int]) -> int:
    def gathered(params: Sequence[Tensor]) -> int:
        return sum(p.numel() * (compute or size[id(p)]) for p in params)

    if strategy == "zero2":
        return gathered(list(module.parameters()))
    units, claimed = [], set()
    for unit in wrap_targets(module, policy):
        own = [p for p in unit.parameters() if id(p) not in claimed]
        claimed.update(id(p) for p in own)
        units.append(gathered(own))
    units.append(gathered([p for p in module.parameters() if id(p) not in claimed]))  # the root unit
    return sum(sorted(units, reverse=True)[:2])


def _model_parallel(module: nn.Module, count: int, device_map: Any, max_memory: Any, size: dict[int, int],
                    states: int, scalar: int) -> list[DeviceMemory]:  # fmt: skip
    slots = list(range(count))
    plan = plan_device_map(module, slots, max_memory) if device_map == "auto" else dict(device_map)
    placed = tensor_devices(module, plan)
    devices = [DeviceMemory() for _ in slots]
    seen: set[int] = set()
    for name, param in module.named_parameters():
        seen.add(id(param))
        device = devices[placed[name]]
        nbytes = param.numel() * size[id(param)]
        device.parameters += nbytes
        if param.requires_grad:
            device.gradients += nbytes
            device.optimizer_state += states * nbytes + scalar
    for name, buffer in module.named_buffers():
        devices[placed[name]].parameters += buffer.numel() * buffer.element_size()
    return devices


def _add_activations(module: nn.Module, example_input: Any, precision: str, strategy: str,
                     devices: list[DeviceMemory], device_map: Any, max_memory: Any, count: int) -> None:  # fmt: skip
    per_leaf: list[tuple[str, int]] = []
    names = {id(m): n for n, m in module.named_modules()}

    def record(sub: nn.Module, args: Any, output: Any) -> None:
        per_leaf.append((names.get(id(sub), ""), _tensor_bytes(output)))

    leaves = [m for m in module.modules() if next(m.children(), None) is None]
    handles = [leaf.register_forward_hook(record) for leaf in leaves]
    try:
        with torch.no_grad():
            args = example_input if isinstance(example_input, tuple) else (example_input,)
            module(*args)
    finally:
        for handle in handles:
            handle.remove()
    scale = 0.5 if precision in ("16-mixed", "bf16-mixed", "16-true", "bf16-true") else 1.0
    if strategy != "model_parallel":
        for device in devices:
            device.activations = int(sum(b for _, b in per_leaf) * scale)
        return
    plan = plan_device_map(module, list(range(count)), max_memory) if device_map == "auto" else dict(device_map)
    keys = sorted(plan, key=len, reverse=True)
    for device in devices:
        device.activations = 0
    current = 0
    for name, nbytes in per_leaf:
        current = next((plan[k] for k in keys if k == "" or name == k or name.startswith(k + ".")), current)
        devices[current].activations += int(nbytes * scale)


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


# ---------------------------------------------------------------------------------------------- report
def compare(module: nn.Module, world_size: int, strategies: Sequence[str] = STRATEGIES, **kwargs: Any) -> list[MemoryEstimate]:
    """:func:`estimate` for each strategy (same arguments)."""
    return [estimate(module, strategy=name, world_size=world_size, **kwargs) for name in strategies]


def format_table(estimates: Sequence[MemoryEstimate]) -> str:
    """One row per strategy: the busiest device's bytes by kind, and its total."""
    header = ["strategy", "parameters", "gradients", "optimizer", "working", "activations", "total / device"]
    rows = [header]
    for item in estimates:
        peak = item.peak
        cells = [getattr(peak, f) for f in _FIELDS]
        rows.append([item.strategy] + [("n/a" if c is None else format_bytes(c)) for c in cells]
                    + [format_bytes(peak.total)])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]  # fmt: skip
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def recommend(estimates: Sequence[MemoryEstimate], device_memory: Union[int, str]) -> str:
    """The data-parallel strategy with the least communication that fits (DDP < ZeRO-1 < ZeRO-2 < FSDP)."""
    budget = parse_bytes(device_memory, "device_memory")
    order = [e for name in ("ddp", "zero1", "zero2", "fsdp") for e in estimates if e.strategy == name]
    for item in order:
        if item.fits(budget):
            return (f"Use strategy={item.strategy!r}: {format_bytes(item.peak.total)} of {format_bytes(budget)} per "
                    f"device (it fits within {HEADROOM:.0%}, with the least communication among those that fit).")  # fmt: skip
    fsdp = next((e for e in estimates if e.strategy == "fsdp"), None)
    if fsdp is None:
        return f"None of these fits in {format_bytes(budget)} per device."
    peak = fsdp.peak
    sharded = (peak.parameters + peak.gradients + peak.optimizer_state) * fsdp.world_size
    fixed = peak.working + (peak.activations or 0)
    if fixed < HEADROOM * budget:
        need = math.ceil(sharded / (HEADROOM * budget - fixed))
        more = f"FSDP on about {need} devices would fit; "
    else:
        more = "even the gathered layers and activations exceed a device: wrap smaller FSDP units or shrink the batch; "
    return (f"Nothing fits in {format_bytes(budget)} per device at world size {fsdp.world_size}. {more}or "
            "FSDPStrategy(cpu_offload=True) keeps parameters, gradients and optimizer state in CPU memory.")  # fmt: skip


def report(module: nn.Module, world_size: int, device_memory: Union[None, int, str] = None, **kwargs: Any) -> str:
    """The table for every strategy, plus a recommendation when ``device_memory`` is given."""
    estimates = compare(module, world_size, **kwargs)
    first = estimates[0]
    text = (f"Memory per device: world size {world_size}, precision {first.precision}, optimizer {first.optimizer} "
            f"(model_parallel: {world_size} devices in one process)\n{format_table(estimates)}")  # fmt: skip
    if device_memory is not None:
        text += "\n" + recommend(estimates, device_memory)
    return text
