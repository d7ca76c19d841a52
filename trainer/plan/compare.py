"""The strategy or layout sweep of ``trainer plan --compare`` (and its alias ``trainer estimate-memory``): the
arithmetic of :mod:`trainer.memory.planner` is a fast first pass over every candidate; the one recommended is then
planned on fake ranks (:func:`trainer.plan.planner.plan_job`), and its figures are the ones reported."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from trainer.plan.hardware import HardwareProfile
from trainer.plan.job import JobSpec
from trainer.plan.planner import Plan, human_bytes, plan_job
from trainer.strategies.errors import ConfigurationError

# The data-parallel strategies by communication, least first, as the fake-rank plan runs them: DDP's bytes are those
# of a pure replicate layout (every rank holds everything, gradients all-reduced); ZeRO-1 has no fake-rank set-up.
_PLANNED_AS: dict[str, dict[str, Any]] = {"ddp": dict(strategy="nd_parallel", dp_replicate="world", dp_shard=1), "zero2": dict(strategy="zero2"),
               "fsdp": dict(strategy="fsdp")}  # fmt: skip


@dataclasses.dataclass
class Candidate:
    """One row of the first pass that the fake-rank plan can run: its label and the job it becomes."""

    label: str
    spec: JobSpec


def strategy_candidates(base: JobSpec, estimates: list[Any], budget: int) -> list[Candidate]:
    """The strategies the arithmetic says fit ``budget``, least communication first, as jobs to plan."""
    rows = {e.strategy: e for e in estimates}
    out = []
    for name, fields in _PLANNED_AS.items():
        if name in rows and rows[name].fits(budget):
            fields = {k: (base.world_size if v == "world" else v) for k, v in fields.items()}
            out.append(Candidate(name, dataclasses.replace(base, **fields)))
    return out


def layout_candidates(base: JobSpec, estimates: list[Any], budget: int) -> list[Candidate]:
    """The N-D layouts the arithmetic says fit ``budget``, least communication (tp × pp) first, as jobs to plan."""
    out = []
    for item in sorted(estimates, key=lambda e: (e.layout.tp * e.layout.pp, e.layout.pp, -e.layout.dp_replicate)):
        if item.fits(budget):
            layout = item.layout
            spec = dataclasses.replace(base, strategy="nd_parallel", dp_replicate=layout.dp_replicate,
                                       dp_shard=layout.dp_shard, tp=layout.tp, pp=layout.pp)  # fmt: skip
            out.append(Candidate(str(layout), spec))
    return out


def recommend_planned(candidates: list[Candidate], hardware: HardwareProfile,
                      budget: int) -> tuple[Optional[Candidate], Optional[Plan], list[str]]:  # fmt: skip
    """Plan the candidates in order on fake ranks; the first the plan accepts is the recommendation. Returns it, its
    plan, and why each one before it was passed over."""
    passed = []
    for candidate in candidates:
        try:
            return candidate, plan_job(candidate.spec, hardware, device_memory=budget), passed
        except ConfigurationError as err:
            passed.append(f"{candidate.label}: {str(err).splitlines()[0]}")
    return None, None, passed


def recommendation_text(chosen: Optional[Candidate], plan: Optional[Plan], passed: list[str], budget: int,
                        hint: str = "") -> str:  # fmt: skip
    """The recommendation with the fake-rank plan's figures (or why nothing was recommended, then ``hint``: the first
    pass's advice, e.g. how many devices FSDP would need)."""
    from trainer.plan.report import format_plan

    lines = [f"- planned on fake ranks, passed over: {why}" for why in passed]
    if chosen is None or plan is None:
        lines.append(f"Nothing the first pass fits in {human_bytes(budget)} per device was accepted by the fake-rank "
                     "plan: shard more (fsdp, a larger world size), or lower the batch or precision.")  # fmt: skip
        return "\n".join(lines + ([hint] if hint else []))
    peak = max(r.step.peak_bytes for role in plan.roles for r in role.results)
    lines.append(f"Use {chosen.label}: its plan on fake ranks peaks at {human_bytes(peak)} of {human_bytes(budget)} "
                 "per device (the least communication among the layouts that fit). Its plan:")  # fmt: skip
    lines.append(format_plan(plan))
    return "\n".join(lines)
