"""Memory planner: how many bytes each device holds for a module under each strategy or N-D layout, before you run it.

``estimate(module, strategy="fsdp", world_size=8, precision="bf16-mixed", optimizer="adam")`` returns a
:class:`MemoryEstimate` with one :class:`DeviceMemory` per rank (per device for ``"model_parallel"``);
``estimate_layout(module, MeshLayout(dp_shard=4, tp=2), tp_plan=..., pipeline=...)`` does the same for a layout of
data parallel (replicated and sharded), tensor parallel and pipeline parallel sizes on one device mesh.

- ``parameters``, ``gradients``, ``optimizer_state``: the bytes of the tensors that persist between steps,
  computed exactly as torch lays them out (the tests compare them with every rank's real local tensors):

  * data parallel: DDP (``dp_replicate``) replicates; ZeRO-1 also replicates parameters and gradients but
    gives every rank the optimizer state of an even dim-0 slice of every parameter
    (:class:`~trainer.strategies.data_parallel.sharded_optimizer.ShardedOptimizer`); ZeRO-2 and FSDP2 (``dp_shard``) give rank
    ``r`` the ``r``-th ``torch.chunk`` of every parameter along dim 0. FSDP2 pads uneven shards: every rank
    allocates ``ceil(rows / dp_shard)`` rows for its parameter and gradient shards, and the figures include
    that padding; the optimizer state (``zeros_like`` of the unpadded shard) does not.
  * tensor parallel (``tp``): each ``ParallelStyle`` of the plan (the dict ``parallelize_module`` takes)
    splits its module's parameters along the dim torch splits (:mod:`trainer.strategies.nd.tp_plan`): colwise a
    Linear's weight and bias on dim 0, rowwise its weight on dim 1, ...; parameters no style covers are
    replicated across ``tp``. FSDP then shards dim 0 of each rank's tensor-parallel piece. (Without FSDP, a
    parameter split on dim 0 keeps ``distribute_tensor``'s padded scatter buffer: ``ceil(rows / tp)`` rows on
    every rank, counted so; its gradient and state are the exact piece.)
  * pipeline parallel (``pp``): each stage holds the parameters of its modules
    (:mod:`trainer.strategies.nd.pipeline_stages`; boundaries given, or balanced by bytes by the device-map planner).
  * model parallel: each tensor on its device-map device.

  Parameters and gradients are float32 under "32-true" and the mixed precisions (master weights), half
  under "16-true"/"bf16-true"; optimizer state has the parameters' dtype, plus Adam's 4-byte ``step`` per
  parameter tensor on every rank that holds the tensor (even an empty shard). Tied weights count once (and
  once per pipeline stage that uses them: each stage keeps a copy).
- ``working``: rough transient memory: DDP/ZeRO-1 gradient buckets (one more copy of the gradients; ZeRO-1
  also gathers the updated slices in buckets of 32 MiB), the gathered parameters of ZeRO-2 (all, in the compute dtype)
  and FSDP (the two largest units: one computing, one prefetched).
- ``activations``: rough, only with ``example_input`` (one micro-batch of one data-parallel rank): the bytes of
  every leaf module's output, halved for 16-bit precisions; under tensor parallelism the outputs a plan
  leaves sharded (after a colwise Linear, up to the rowwise one; sequence parallel) count 1/tp; a pipeline
  stage counts its own modules' outputs times the micro-batches it holds at once (GPipe: all of them;
  1F1B: ``pp - stage``). Activation checkpointing, fused kernels and the autograd graph's own saves make the
  real figure differ; measure with ``MemoryMonitor`` for the truth.

:func:`report` prints a table for every strategy and recommends the one with the least communication that
fits a device; :func:`layout_report` the same per layout. ``trainer estimate-memory module.py:Class
--world-size 8 [--dp-shard 4 --tp 2 --pp 1 --tp-plan megatron]`` (:mod:`trainer.cli.estimate_memory`) builds
the module on the ``meta`` device and prints them.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from trainer.strategies.nd.device_map import format_bytes, parse_bytes, plan_device_map, tensor_devices
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.data_parallel.fsdp import check_wrap_policy, wrap_targets
from trainer.strategies.nd.mesh import MeshLayout, resolve_layout
from trainer.strategies.nd.pipeline_stages import auto_boundaries, module_stages, parameter_stages
from trainer.strategies.precision import canonical_precision
from trainer.strategies.data_parallel.sharded_optimizer import BUCKET_BYTES, chunk_rows
from trainer.strategies.nd.tp_plan import block_modules, megatron_plan, replicated_gradients, resolve_tp_plan, tp_shard_dims

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "model_parallel")
SCHEDULES = ("1F1B", "GPipe")
HEADROOM = 0.9  # a plan "fits" when it needs at most this share of a device (allocator, buffers, fragmentation)
_HALF = {"16-true": torch.float16, "bf16-true": torch.bfloat16}
_FIELDS = ("parameters", "gradients", "optimizer_state", "working", "activations")


@dataclass
class DeviceMemory:
    """Bytes on one device (``activations`` is ``None`` when no example input was given; it is
    ``activations_per_microbatch`` times ``in_flight``, the micro-batches a pipeline stage holds at once)."""

    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    working: int = 0
    activations: Optional[int] = None
    activations_per_microbatch: Optional[int] = None
    in_flight: int = 1

    @property
    def total(self) -> int:
        """Everything above, added."""
        return self.parameters + self.gradients + self.optimizer_state + self.working + (self.activations or 0)


@dataclass
class MemoryEstimate:
    """One strategy's or layout's plan: ``devices[i]`` is rank ``i`` (device ``i`` for model parallel).
    ``notes`` say where tied weights and pipeline boundaries went."""

    strategy: str
    world_size: int
    precision: str
    optimizer: str
    devices: list[DeviceMemory] = field(default_factory=list)
    layout: Optional["MeshLayout"] = None
    notes: list[str] = field(default_factory=list)

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
def _rows_held(rows: int, parts: int, index: int) -> int:
    piece = chunk_rows(rows, parts, index)
    return piece.stop - piece.start


def shard_numel(param: Tensor, world_size: int, rank: int) -> int:
    """Elements of ``param`` on ``rank`` under FSDP2 (``torch.chunk`` along dim 0; trailing ranks may get none)."""
    rows = param.shape[0] if param.dim() else 1
    return _rows_held(rows, world_size, rank) * (param.numel() // rows if rows else 0)


def _itemsize(param: Tensor, precision: str) -> int:
    dtype = _HALF.get(precision) or (torch.float64 if precision == "64-true" else param.dtype)
    return torch.empty((), dtype=dtype).element_size()


def _compute_itemsize(precision: str) -> Optional[int]:
    return None if precision in ("32-true", "64-true") else 2


@dataclass
class _Split:
    """Where every tensor of a module goes: its tensor-parallel dim and the pipeline stages holding it."""

    stage_tensors: list[list[tuple[str, Tensor]]]  # per stage: (first name there, tensor), each tensor once
    tp_dims: dict[str, Optional[int]]
    whole_grads: list[set[int]]  # per stage: tensors whose TP gradient is materialised whole (see tp_plan)
    module_stage: dict[str, int]
    plan: dict[str, Any]  # resolved TP plan: {module name: ParallelStyle}
    notes: list[str]


def _split(module: nn.Module, layout: MeshLayout, tp_plan: Any, pipeline: Any, policy: Any) -> _Split:
    named = list(module.named_parameters(remove_duplicate=False))
    notes: list[str] = []
    plan: dict[str, Any] = {}
    tp_dims: dict[str, Optional[int]] = {name: None for name, _ in named}
    whole: set[str] = set()
    if layout.tp > 1:
        if tp_plan is None:
            raise ConfigurationError(
                f"tp={layout.tp} needs a tensor-parallel plan: tp_plan='megatron', or the dict you pass to "
                "parallelize_module ({'layers.*.attn.q': ColwiseParallel(), ...})."
            )
        if tp_plan == "megatron":
            tp_plan = megatron_plan(module, _block_classes(policy))
        plan = resolve_tp_plan(module, tp_plan)
        tp_dims = tp_shard_dims(module, plan)
        whole = replicated_gradients(module, plan)
    stages: dict[str, int] = {name: 0 for name, _ in named}
    module_stage: dict[str, int] = {name: 0 for name, _ in module.named_modules(remove_duplicate=False)}
    if layout.pp > 1:
        boundaries = list(pipeline) if pipeline not in (None, "auto") else auto_boundaries(
            module, layout.pp, _block_classes(policy) or tuple({type(m) for _, m in block_modules(module)}))
        if len(boundaries) != layout.pp - 1:
            raise ConfigurationError(
                f"pp={layout.pp} needs {layout.pp - 1} pipeline boundaries (the modules that begin stages 1..), "
                f"got {len(boundaries)}: {boundaries}."
            )
        stages = parameter_stages(module, boundaries)
        module_stage = module_stages(module, boundaries)
        notes.append(f"the pipeline stages after the first begin at {', '.join(boundaries)}")
    uses: dict[int, list[str]] = {}  # id(tensor) -> every name it has
    for name, param in named:
        uses.setdefault(id(param), []).append(name)
    stage_tensors: list[list[tuple[str, Tensor]]] = [[] for _ in range(layout.pp)]
    seen: list[dict[int, str]] = [{} for _ in range(layout.pp)]
    first_name: dict[int, str] = {}
    for name, param in named:
        first = first_name.setdefault(id(param), name)
        stage = stages[name]
        if id(param) not in seen[stage]:
            seen[stage][id(param)] = name
            stage_tensors[stage].append((name, param))
        if first != name:
            notes.append(f"'{name}' is tied to '{first}': counted once")
            holders = sorted({stages[n] for n in uses[id(param)]})
            if len(holders) > 1:
                notes.append(f"pipeline stages {' and '.join(map(str, holders))} each hold a copy of '{first}' (as "
                             f"'{name}' too): sum their gradients before the optimizer step")  # fmt: skip
            together = any(sum(stages[n] == k for n in uses[id(param)]) > 1 for k in holders)
            if layout.tp > 1 and together:
                notes.append(f"re-tie '{name}' to '{first}' after parallelize_module (it gives each module a parameter "
                             "of its own)")  # fmt: skip
    # a gradient is whole when every use of the tensor on the stage makes a whole one (a sharded use sums into it)
    whole_grads = [{id(p) for _, p in tensors if all(n in whole for n in uses[id(p)] if stages[n] == stage)}
                   for stage, tensors in enumerate(stage_tensors)]  # fmt: skip
    if layout.dp_shard == 1 and any(whole_grads):
        notes.append(f"the gradient of {', '.join(sorted(whole))} (a RowwiseParallel embedding) is whole on every "
                     "tensor-parallel rank (torch's backward makes it Replicate) unless FSDP shards it or a sharded "
                     "tied use on the stage comes first")
    return _Split(stage_tensors, tp_dims, whole_grads, module_stage, plan, notes)


def _block_classes(policy: Any) -> tuple[type, ...]:
    policy = check_wrap_policy(policy)
    return policy if isinstance(policy, tuple) else ()


def _local_shape(shape: torch.Size, dim: Optional[int], tp: int, tp_rank: int) -> list[int]:
    local = list(shape)
    if dim is not None:
        local[dim] = _rows_held(shape[dim], tp, tp_rank)
    return local


def _rank_memory(split: _Split, layout: MeshLayout, coords: dict[str, int], size: dict[int, int], states: int,
                 scalar: int, zero1: bool) -> DeviceMemory:  # fmt: skip
    """Persistent bytes of one rank: its stage's tensors, split by TP, then by FSDP (or ZeRO-1's state slices)."""
    device = DeviceMemory()
    shards = layout.dp_shard
    for name, param in split.stage_tensors[coords["pp"]]:
        local = _local_shape(param.shape, split.tp_dims[name], layout.tp, coords["tp"])
        numel = math.prod(local)
        rows = local[0] if local else 1
        row = numel // rows if rows else 0
        grad_numel = None
        if shards > 1:  # FSDP2: dim 0 of the TP piece, every rank padded to ceil(rows / shards)
            padded = -(-rows // shards) * row
            mine = _rows_held(rows, shards, coords["dp_shard"]) * row
        elif split.tp_dims[name] == 0 and layout.tp > 1:  # distribute_tensor keeps the padded scatter buffer
            padded = -(-param.shape[0] // layout.tp) * row
            mine = grad_numel = numel
            if id(param) in split.whole_grads[coords["pp"]]:
                grad_numel = param.numel()
        else:
            padded = mine = numel
        if zero1 and local:  # ZeRO-1: whole parameters and gradients, a dim-0 slice of the state
            state_numel = _rows_held(rows, layout.dp_replicate, coords["dp_replicate"]) * row
        else:
            state_numel = mine
        nbytes = size[id(param)]
        device.parameters += padded * nbytes
        if param.requires_grad:
            device.gradients += (padded if grad_numel is None else grad_numel) * nbytes
            device.optimizer_state += states * state_numel * nbytes + scalar
    return device


def _working(module: nn.Module, split: _Split, layout: MeshLayout, coords: dict[str, int], device: DeviceMemory,
             size: dict[int, int], compute: Optional[int], kind: str, policy: Any) -> int:  # fmt: skip
    """Transient bytes: ``kind`` is "buckets" (DDP), "zero1", "all" (ZeRO-2: everything gathered) or "units" (FSDP)."""
    tensors = split.stage_tensors[coords["pp"]]
    if kind == "buckets":
        return device.gradients
    if kind == "zero1":  # + one gather bucket of updated slices (a parameter larger than a bucket goes alone)
        sizes = [p.numel() * size[id(p)] for _, p in tensors]
        return device.gradients + max(max(sizes, default=0), min(sum(sizes), BUCKET_BYTES))
    gathered = {id(p): math.prod(_local_shape(p.shape, split.tp_dims[n], layout.tp, coords["tp"]))
                * (compute or size[id(p)]) for n, p in tensors}  # fmt: skip
    if kind == "all":
        return sum(gathered.values())
    units, claimed = [], set()
    for unit in wrap_targets(module, policy):
        own = [id(p) for p in unit.parameters() if id(p) not in claimed and id(p) in gathered]
        claimed.update(own)
        units.append(sum(gathered[i] for i in own))
    units.append(sum(b for i, b in gathered.items() if i not in claimed))  # the root unit
    return sum(sorted(units, reverse=True)[:2])


def _devices(module: nn.Module, layout: MeshLayout, split: _Split, precision: str, optimizer: Any, policy: Any,
             zero1: bool = False, working: Optional[str] = None) -> tuple[list[DeviceMemory], str]:  # fmt: skip
    states, scalar, optimizer_name = optimizer_states(optimizer)
    size = {id(p): _itemsize(p, precision) for p in module.parameters()}
    if working is None:
        working = "units" if layout.dp_shard > 1 else ("buckets" if layout.dp_replicate > 1 else "none")
    cache: dict[tuple[int, int, int, int], DeviceMemory] = {}
    devices = []
    for rank in range(layout.world_size):
        coords = layout.coordinates(rank)
        key = (coords["pp"], coords["dp_shard"], coords["tp"], coords["dp_replicate"] if zero1 else 0)
        if key not in cache:
            device = _rank_memory(split, layout, coords, size, states, scalar, zero1)
            if working != "none":
                device.working = _working(module, split, layout, coords, device, size, _compute_itemsize(precision),
                                          working, policy)  # fmt: skip
            cache[key] = device
        devices.append(DeviceMemory(**vars(cache[key])))
    return devices, optimizer_name


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
) -> MemoryEstimate:
    """Per-device bytes of ``module`` trained with ``strategy`` on ``world_size`` ranks (devices for
    ``"model_parallel"``). ``auto_wrap_policy`` is FSDP's; ``device_map``/``max_memory`` model parallel's."""
    if strategy not in STRATEGIES:
        raise ConfigurationError(f"estimate(strategy={strategy!r}): use one of {', '.join(STRATEGIES)}.")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigurationError(f"estimate(world_size={world_size!r}) must be a positive int.")
    precision = canonical_precision(precision)
    if strategy == "model_parallel":
        states, scalar, optimizer_name = optimizer_states(optimizer)
        size = {id(p): _itemsize(p, precision) for p in module.parameters()}
        plan = plan_device_map(module, list(range(world_size)), max_memory) if device_map == "auto" else dict(device_map)
        devices = _model_parallel(module, world_size, plan, size, states, scalar)
        if example_input is not None:
            outputs = _leaf_outputs(module, example_input)
            _add_model_parallel_activations(outputs, plan, devices, _activation_scale(precision))
        return MemoryEstimate(strategy, world_size, precision, optimizer_name, devices,
                              notes=_tied_notes(module, plan))  # fmt: skip
    sharded = strategy in ("zero2", "fsdp")
    layout = MeshLayout(dp_shard=world_size) if sharded else MeshLayout(dp_replicate=world_size)
    split = _split(module, layout, None, None, auto_wrap_policy)
    working = {"ddp": "buckets", "zero1": "zero1", "zero2": "all", "fsdp": "units"}[strategy]
    devices, optimizer_name = _devices(module, layout, split, precision, optimizer, auto_wrap_policy,
                                       zero1=strategy == "zero1", working=working)  # fmt: skip
    if example_input is not None:
        per_microbatch = int(sum(b for _, b in _leaf_outputs(module, example_input)) * _activation_scale(precision))
        for device in devices:
            device.activations = device.activations_per_microbatch = per_microbatch
    return MemoryEstimate(strategy, world_size, precision, optimizer_name, devices, notes=split.notes)


def estimate_layout(
    module: nn.Module,
    layout: MeshLayout,
    tp_plan: Any = None,
    pipeline: Union[None, str, Sequence[str]] = None,
    precision: Any = "32-true",
    optimizer: Any = "adam",
    example_input: Any = None,
    auto_wrap_policy: Any = None,
    microbatches: Optional[int] = None,
    schedule: str = "1F1B",
) -> MemoryEstimate:
    """Per-rank bytes of ``module`` on the N-D ``layout``.

    Args:
        tp_plan: for ``tp > 1``: the plan ``parallelize_module`` takes (``{"layers.*.attn.q": ColwiseParallel(),
            ...}``), or ``"megatron"`` (:func:`trainer.strategies.nd.tp_plan.megatron_plan`).
        pipeline: for ``pp > 1``: the names of the modules that begin stages 1, 2, ..., or ``"auto"``/None
            (the device-map planner's split, balanced by bytes, blocks kept whole).
        auto_wrap_policy: FSDP's units over ``dp_shard`` (a set of block classes also names the blocks for the
            megatron plan and the automatic pipeline split).
        example_input: one micro-batch of one data-parallel rank, for the activations.
        microbatches: micro-batches per step (default ``pp``); ``schedule``: ``"1F1B"`` or ``"GPipe"``.
    """
    if not isinstance(layout, MeshLayout):
        raise ConfigurationError(f"layout={layout!r} must be a strategies.nd.mesh.MeshLayout, e.g. MeshLayout(dp_shard=4, tp=2).")
    precision = canonical_precision(precision)
    names = {s.lower(): s for s in SCHEDULES}
    if str(schedule).lower() not in names:
        raise ConfigurationError(f"schedule={schedule!r} is not known; use one of {', '.join(SCHEDULES)}.")
    schedule = names[str(schedule).lower()]
    microbatches = layout.pp if microbatches is None else microbatches
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ConfigurationError(f"microbatches={microbatches!r} must be a positive int.")
    split = _split(module, layout, tp_plan, pipeline, auto_wrap_policy)
    devices, optimizer_name = _devices(module, layout, split, precision, optimizer, auto_wrap_policy)
    if example_input is not None:
        per_stage = _stage_activations(module, example_input, split, layout, _activation_scale(precision))
        for rank, device in enumerate(devices):
            stage = layout.coordinates(rank)["pp"]
            flight = 1 if layout.pp == 1 else (microbatches if schedule == "GPipe" else min(microbatches, layout.pp - stage))
            device.activations_per_microbatch, device.in_flight = per_stage[stage], flight
            device.activations = per_stage[stage] * flight
    notes = list(split.notes)
    if layout.pp > 1:
        notes.append(f"{microbatches} micro-batches per step, {schedule}")
    return MemoryEstimate(layout.name, layout.world_size, precision, optimizer_name, devices, layout, notes)


def _model_parallel(module: nn.Module, count: int, plan: dict[str, Any], size: dict[int, int], states: int,
                    scalar: int) -> list[DeviceMemory]:  # fmt: skip
    placed = tensor_devices(module, plan)
    devices = [DeviceMemory() for _ in range(count)]
    for name, param in module.named_parameters():
        device = devices[placed[name]]
        nbytes = param.numel() * size[id(param)]
        device.parameters += nbytes
        if param.requires_grad:
            device.gradients += nbytes
            device.optimizer_state += states * nbytes + scalar
    for name, buffer in module.named_buffers():
        devices[placed[name]].parameters += buffer.numel() * buffer.element_size()
    return devices


def _tied_notes(module: nn.Module, plan: dict[str, Any]) -> list[str]:
    placed = tensor_devices(module, plan)
    first: dict[int, str] = {}
    notes = []
    for name, param in module.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), name)
        if owner != name:
            notes.append(f"'{name}' is tied to '{owner}': counted once")
            notes.append(f"'{name.rpartition('.')[0]}' runs on device {placed[owner]}, where its tied weight is")
    return notes


# ---------------------------------------------------------------------------------------------- activations
def _activation_scale(precision: str) -> float:
    return 0.5 if precision in ("16-mixed", "bf16-mixed", "16-true", "bf16-true") else 1.0


@dataclass
class _Recorded:
    """An example input whose forward was already recorded (one forward serves every row of a table)."""

    outputs: list[tuple[str, int]]


def _recorded(module: nn.Module, example_input: Any) -> Any:
    return None if example_input is None else _Recorded(_leaf_outputs(module, example_input))


def _leaf_outputs(module: nn.Module, example_input: Any) -> list[tuple[str, int]]:
    """``(leaf module name, bytes of its output)`` for every leaf call of one forward, in call order."""
    if isinstance(example_input, _Recorded):
        return example_input.outputs
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
    return per_leaf


def _stage_activations(module: nn.Module, example_input: Any, split: _Split, layout: MeshLayout, scale: float) -> list[int]:
    """Per stage, the bytes of one micro-batch's leaf outputs. Under the TP plan an output is split over tp
    from a colwise Linear (sharded output) on, through the leaves after it, up to a rowwise one that replicates
    its output again; a sequence-parallel module's output and a rowwise one with a sharded output are split too."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    per_stage = [0.0] * layout.pp
    sharded = False  # whether the activation flowing from leaf to leaf is split over tp
    for name, nbytes in _leaf_outputs(module, example_input):
        style = split.plan.get(name)
        if isinstance(style, (ColwiseParallel, RowwiseParallel)):
            sharded = any(isinstance(p, Shard) for p in style.output_layouts)
        elif isinstance(style, SequenceParallel):
            sharded = True
        per_stage[split.module_stage.get(name, 0)] += nbytes * scale / (layout.tp if sharded else 1)
    return [int(b) for b in per_stage]


def _add_model_parallel_activations(outputs: list[tuple[str, int]], plan: dict[str, Any], devices: list[DeviceMemory],
                                    scale: float) -> None:  # fmt: skip
    keys = sorted(plan, key=len, reverse=True)
    for device in devices:
        device.activations = 0
    for name, nbytes in outputs:
        key = next((k for k in keys if k == "" or name == k or name.startswith(k + ".")), None)
        device = devices[plan[key] if key is not None else 0]
        device.activations = (device.activations or 0) + int(nbytes * scale)
    for device in devices:
        device.activations_per_microbatch = device.activations


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
    kwargs["example_input"] = _recorded(module, kwargs.get("example_input"))
    return [estimate(module, strategy=name, world_size=world_size, **kwargs) for name in strategies]


def format_table(estimates: Sequence[MemoryEstimate], label: str = "strategy") -> str:
    """One row per strategy (or layout): the busiest device's bytes by kind, and its total."""
    layouts = any(e.layout is not None and e.layout.pp > 1 for e in estimates)
    header = [label, "parameters", "gradients", "optimizer", "working", "activations", "total / device"]
    rows = [header]
    for item in estimates:
        peak = item.peak
        cells = [("n/a" if getattr(peak, f) is None else format_bytes(getattr(peak, f))) for f in _FIELDS]
        if layouts and peak.activations is not None and peak.in_flight > 1:
            cells[4] = f"{peak.in_flight} x {format_bytes(peak.activations_per_microbatch)}"
        rows.append([item.strategy] + cells + [format_bytes(peak.total)])
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
    text += _notes_text(estimates)
    if device_memory is not None:
        text += "\n" + recommend(estimates, device_memory)
    return text


def _notes_text(estimates: Sequence[MemoryEstimate]) -> str:
    """Each note once, naming the rows it is about unless it is about all of them."""
    notes = dict.fromkeys(note for e in estimates for note in e.notes)
    lines = []
    for note in notes:
        rows = [e.strategy for e in estimates if note in e.notes]
        lines.append(f"\n- {note}" + ("" if len(rows) == len(estimates) else f" [{', '.join(rows)}]"))
    return "".join(lines)


def layouts_for(world_size: int, dp_replicate: Sequence[int] = (1,), dp_shard: Sequence[int] = (-1,),
                tp: Sequence[int] = (1,), pp: Sequence[int] = (1,)) -> list[MeshLayout]:  # fmt: skip
    """Every combination of the given sizes that makes ``world_size`` ranks (one size list may hold -1: the rest).
    A single combination that does not fit raises, naming the sizes."""
    combos = list(itertools.product(dp_replicate, dp_shard, tp, pp))
    layouts = []
    for r, s, t, p in combos:
        try:
            layouts.append(resolve_layout(world_size, dp_replicate=r, dp_shard=s, tp=t, pp=p))
        except ConfigurationError:
            if len(combos) == 1:
                raise
    if not layouts:
        raise ConfigurationError(f"None of the size combinations makes {world_size} processes.")
    return sorted(dict.fromkeys(layouts), key=lambda l: (l.tp * l.pp, l.tp, l.pp, l.dp_replicate))


def layout_report(module: nn.Module, layouts: Sequence[MeshLayout], device_memory: Union[None, int, str] = None,
                  **kwargs: Any) -> str:  # fmt: skip
    """The table for every layout (arguments of :func:`estimate_layout`), its notes, and a recommendation when
    ``device_memory`` is given: of the layouts that fit, the one with the least tensor and pipeline
    parallelism (they communicate per layer and per micro-batch; data parallelism once per step), and then
    the most replicas (DDP all-reduces 2Ψ per step, FSDP moves 3Ψ)."""
    kwargs["example_input"] = _recorded(module, kwargs.get("example_input"))
    estimates = [estimate_layout(module, layout, **kwargs) for layout in layouts]
    first = estimates[0]
    text = (f"Memory per rank: world size {first.world_size}, precision {first.precision}, optimizer {first.optimizer} "
            f"(the busiest rank of each layout)\n{format_table(estimates, label='layout')}")  # fmt: skip
    text += _notes_text(estimates)
    if device_memory is not None:
        budget = parse_bytes(device_memory, "device_memory")
        fitting = [e for e in estimates if e.fits(budget)]
        if fitting:
            best = min(fitting, key=lambda e: (e.layout.tp * e.layout.pp, e.layout.pp, -e.layout.dp_replicate))
            text += (f"\nFits in {format_bytes(budget)} (within {HEADROOM:.0%}): {', '.join(e.strategy for e in fitting)}. "
                     f"Least communication among them: {best.strategy} ({format_bytes(best.peak.total)} per rank).")  # fmt: skip
        else:
            text += f"\nNo layout fits in {format_bytes(budget)} per rank; add ranks, micro-batches or activation checkpointing."
    return text
