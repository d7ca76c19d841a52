"""The plan of a job: its rank roles, each planned on fake ranks (:mod:`trainer.plan.fake_rank`), the step-time
bounds against a hardware profile, and the refusal of a layout that does not fit the device's memory."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

from trainer.plan.collectives import summarise
from trainer.plan.fake_rank import RankResult, plan_rank_isolated
from trainer.plan.hardware import HardwareProfile
from trainer.plan.job import JobSpec, check_divisible_by_tp, check_job, layer_count, make_module, tokens_per_step
from trainer.strategies.errors import ConfigurationError

_RING = {"all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0, "all_reduce": 2.0}


@dataclasses.dataclass
class Role:
    """Ranks that hold the same part of the model and run the same step (a pipeline stage; every rank without one)."""

    name: str
    ranks: list[int]
    results: list[RankResult] = dataclasses.field(default_factory=list)

    @property
    def largest(self) -> RankResult:
        """The planned rank of this role with the highest peak."""
        return max(self.results, key=lambda r: r.step.peak_bytes)

    @property
    def smallest(self) -> RankResult:
        """The planned rank of this role with the lowest peak."""
        return min(self.results, key=lambda r: r.step.peak_bytes)


@dataclasses.dataclass
class Plan:
    """A planned job: its roles, step-time bounds (seconds) and throughput; :meth:`as_dict` is ``--json``."""

    spec: JobSpec
    roles: list[Role]
    hardware: HardwareProfile
    compute_s: float
    communication_s: float
    tokens_per_step: Optional[int]
    plan_seconds: float

    @property
    def step_bounds(self) -> tuple[float, float]:
        """(lower, upper) step time: communication hidden behind compute, or not at all."""
        return max(self.compute_s, self.communication_s), self.compute_s + self.communication_s

    def role_memory_budget(self, device_memory: Optional[int]) -> int:
        """Bytes one device may use: ``--device-memory`` or the hardware profile's."""
        return device_memory if device_memory is not None else self.hardware.memory_bytes

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` object (API.md's keys and more)."""
        lower, upper = self.step_bounds
        peak = self.hardware.peak_flops(_compute_dtype(self.spec.precision))
        flops = max(role.largest.step.flops for role in self.roles) * (self.spec.accumulate or 1)
        peaks = [r.step.peak_bytes for role in self.roles for r in role.results]
        out: dict[str, Any] = {
            "world_size": self.spec.world_size, "strategy": self.spec.strategy,
            "layout": {k: v for k, v in dataclasses.asdict(self.spec.layout()).items()},
            "hardware": self.hardware.name,
            "roles": [_role_dict(role) for role in self.roles],
            "peak_bytes": {"largest": max(peaks), "smallest": min(peaks),
                           "imbalance": max(peaks) / min(peaks) - 1 if min(peaks) else 0.0},
            "step_time_s": {"compute": self.compute_s, "communication": self.communication_s, "lower": lower,
                            "upper": upper},
            "flops_per_rank_per_step": flops,
            "mfu": {"best": flops / (lower * peak) if lower else None, "worst": flops / (upper * peak) if upper else None},
            "plan_seconds": self.plan_seconds,
        }  # fmt: skip
        if self.tokens_per_step is not None:
            out["tokens_per_step"] = self.tokens_per_step
            out["tokens_per_s"] = {"best": self.tokens_per_step / lower if lower else None,
                                   "worst": self.tokens_per_step / upper if upper else None}  # fmt: skip
        return out


def _role_dict(role: Role) -> dict[str, Any]:
    top = role.largest
    return {"name": role.name, "ranks": role.ranks, **top.held, "peak_bytes": top.step.peak_bytes,
            "peak_holders": top.step.peak_holders, "smallest_peak_bytes": role.smallest.step.peak_bytes,
            "largest_rank": top.rank, "smallest_rank": role.smallest.rank, "flops": top.step.flops,
            "whole_step": top.step.whole_step,
            "collectives": [c.as_dict() for c in top.step.collectives],
            "collectives_summary": summarise(top.step.collectives)}  # fmt: skip


def _compute_dtype(precision: str) -> str:
    from trainer.strategies.precision import canonical_precision

    name = canonical_precision(precision)
    return "bf16" if name.startswith("bf16") else "fp16" if name.startswith("16") else "fp32"


def roles_of(spec: JobSpec) -> list[Role]:
    """One role per pipeline stage (every rank when there is no pipeline)."""
    layout = spec.layout()
    if layout.pp == 1:
        return [Role("all ranks", list(range(spec.world_size)))]
    stages: list[list[int]] = [[] for _ in range(layout.pp)]
    for rank in range(spec.world_size):
        stages[layout.coordinates(rank)["pp"]].append(rank)
    return [Role(f"pipeline stage {s}", ranks) for s, ranks in enumerate(stages)]


def _span(ranks: list[int]) -> str:
    contiguous = ranks == list(range(ranks[0], ranks[-1] + 1))
    return f"ranks {ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1 else f"{len(ranks)} ranks from {ranks[0]}"


def check_module(spec: JobSpec) -> None:
    """What the module itself must allow: heads and widths divisible by tp, layers at least pp."""
    module = make_module(spec)
    check_divisible_by_tp(module, spec.tp)
    layers = layer_count(module)
    if spec.pp > 1 and layers is not None and layers < spec.pp:
        raise ConfigurationError(
            f"pipeline stage {layers} and later: --pp {spec.pp} is more than the {layers} layers of "
            f"{spec.module_name}, so a stage would hold no layer. Use --pp {layers} or fewer."
        )


def plan_job(spec: JobSpec, hardware: HardwareProfile, world_size: Optional[int] = None,
             device_memory: Optional[int] = None, both_ends: bool = True) -> Plan:  # fmt: skip
    """Check the job, plan each rank role (its first and, with ``both_ends``, last rank), bound the step time and
    refuse a role whose peak is over the device's memory."""
    started = time.perf_counter()
    check_job(spec, world_size)
    check_module(spec)
    roles = roles_of(spec)
    for role in roles:
        for rank in dict.fromkeys([role.ranks[0], role.ranks[-1]] if both_ends else [role.ranks[0]]):
            try:
                role.results.append(plan_rank_isolated(spec, rank))
            except ConfigurationError as err:
                raise ConfigurationError(f"{role.name} ({_span(role.ranks)}), rank {rank}: {err}") from None
    compute, communication = _step_time(spec, roles, hardware)
    plan = Plan(spec, roles, hardware, compute, communication, tokens_per_step(spec, spec.layout().dp),
                time.perf_counter() - started)  # fmt: skip
    budget = plan.role_memory_budget(device_memory)
    over = [role for role in roles if role.largest.step.peak_bytes > budget]
    if over:
        raise ConfigurationError(over_budget_message(plan, over[0], budget))
    return plan


def _step_time(spec: JobSpec, roles: list[Role], hardware: HardwareProfile) -> tuple[float, float]:
    """The slowest role's compute (its FLOPs at the profile's peak) and communication (ring bytes over the
    intra- or inter-node bandwidth of each collective's group), for a whole step (× accumulation)."""
    peak = hardware.peak_flops(_compute_dtype(spec.precision))
    per_node = spec.devices_per_node
    compute = communication = 0.0
    for role in roles:
        result = role.largest
        compute = max(compute, result.step.flops / peak)
        seconds = 0.0
        for c in result.step.collectives:
            n = c.group_size
            wire = c.bytes * _RING.get(c.op, 1.0) * ((n - 1) / n if c.op in _RING else 1.0)
            spans_nodes = _spans_nodes(c.mesh_dim, spec, per_node, n)
            seconds += wire / (hardware.inter_node_bw if spans_nodes else hardware.intra_node_bw)
        communication = max(communication, seconds)
    accumulate = spec.accumulate or 1
    return compute * accumulate, communication * accumulate


def _spans_nodes(dim: str, spec: JobSpec, per_node: int, group_size: int) -> bool:
    """Whether a group of mesh dimension ``dim`` reaches beyond one node (the mesh is row-major: the last
    dimensions are the innermost, on one node first)."""
    if spec.nodes == 1:
        return False
    if spec.strategy != "nd_parallel" or dim in ("world", "") or "," in dim:
        return True
    layout = spec.layout()
    inner = 1
    for role in ("tp", "dp_shard", "dp_replicate", "pp"):
        if role in dim.split("_") or dim == role:
            return inner * layout.size(role) > per_node
        inner *= layout.size(role)
    return True


def over_budget_message(plan: Plan, role: Role, budget: int) -> str:
    """Which role is over, by how much, its biggest holder, and the layouts an estimate says would fit."""
    top = role.largest
    holders = dict(top.step.peak_holders)
    biggest = max(holders, key=holders.get) if holders else "?"
    lines = [
        f"{role.name} ({_span(role.ranks)}): the step's peak is {human_bytes(top.step.peak_bytes)} on rank {top.rank}, over "
        f"the {human_bytes(budget)} of one device; the biggest holder is {biggest} ({human_bytes(holders.get(biggest, 0))}).",
    ]
    fits = suggest_layouts(plan, role, budget)
    lines.append("Layouts that an estimate from this plan says fit (plan them to confirm): " + "; ".join(fits)
                 if fits else "No layout of the same world size fits by the estimate: add nodes, or use a device "
                 "with more memory.")  # fmt: skip
    return "\n".join(lines)


def suggest_layouts(plan: Plan, role: Role, budget: int) -> list[str]:
    """Other layouts of the same world size, estimated from this plan: sharded state (parameters, gradients,
    optimizer) scales with 1/(dp_shard × tp × pp), activations with micro-batch / (tp × checkpointing)."""
    spec = plan.spec
    top = role.largest
    state = sum(top.held.values())
    activations = max(0, top.step.peak_bytes - state)
    layout = spec.layout()
    shards = (layout.dp_shard if spec.strategy in ("fsdp", "zero2", "nd_parallel") else 1) * layout.tp * layout.pp
    out: list[str] = []
    world = spec.world_size
    for tp in (1, 2, 4, 8, 16):
        for pp in (1, 2, 4, 8):
            if world % (tp * pp) or spec.strategy != "nd_parallel" and (tp > 1 or pp > 1):
                continue
            for ckpt in (False, True):
                if ckpt and spec.activation_checkpointing:
                    continue
                dp_shard = world // (tp * pp)
                new_state = state * shards / (dp_shard * tp * pp)
                new_act = activations * layout.tp / tp / (4 if ckpt and not spec.activation_checkpointing else 1)
                if new_state + new_act <= budget * 0.9 and (tp, pp, ckpt) != (layout.tp, layout.pp, False):
                    extra = " --activation-checkpointing BLOCK" if ckpt else ""
                    out.append(f"--dp-shard {dp_shard} --tp {tp} --pp {pp}{extra} (~{human_bytes(new_state + new_act)})")
                    break
    return out[:4]


def human_bytes(value: float) -> str:
    """``1.50 GiB``, ``12.00 KiB``, ``512 B``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{int(value)} B"


