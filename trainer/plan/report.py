"""The plan as a table: one block per rank role (bytes held, peak and its holders, collectives), then the step."""
from __future__ import annotations

from typing import Any

from trainer.plan.planner import Plan, human_bytes as _size


def _seconds(value: float) -> str:
    if value < 1e-3:
        return f"{value * 1e6:.1f} µs"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def format_plan(plan: Plan) -> str:
    """The human-readable plan."""
    data: dict[str, Any] = plan.as_dict()
    spec = plan.spec
    layout = " × ".join(f"{k}={v}" for k, v in data["layout"].items() if v > 1) or "1 rank"
    lines = [f"Plan of {spec.module_name}: {spec.world_size} ranks ({spec.nodes} node(s) × {spec.devices_per_node}), "
             f"{spec.strategy} [{layout}], {spec.precision}, on {plan.hardware.name} "
             f"(planned in {data['plan_seconds']:.1f} s)", ""]  # fmt: skip
    header = f"{'rank role':<22}{'ranks':>8}{'params':>12}{'grads':>12}{'optimizer':>12}{'peak':>12}  biggest holder at peak"
    lines += [header, "-" * len(header)]
    for role in data["roles"]:
        holders = role["peak_holders"]
        biggest = max(holders, key=holders.get) if holders else "-"
        lines.append(f"{role['name']:<22}{len(role['ranks']):>8}{_size(role['param_bytes']):>12}"
                     f"{_size(role['grad_bytes']):>12}{_size(role['optimizer_bytes']):>12}"
                     f"{_size(role['peak_bytes']):>12}  {biggest} ({_size(holders.get(biggest, 0))})")  # fmt: skip
    if not all(role["whole_step"] for role in data["roles"]):
        lines.append("pipeline stages: set-up (cut, sharding) and optimizer step planned; the schedule's forward and "
                     "backward are not (a fake process group cannot carry activations between stages), so their peak "
                     "leaves out activations and their FLOPs are 6 × parameters × tokens")  # fmt: skip
    peaks = data["peak_bytes"]
    lines.append(f"largest rank peak {_size(peaks['largest'])}, smallest {_size(peaks['smallest'])}, imbalance "
                 f"{peaks['imbalance'] * 100:.1f}%")  # fmt: skip
    lines += ["", "Collectives of one micro-batch's step (per rank role): op over mesh dim × count = bytes"]
    for role in data["roles"]:
        parts = [f"{c['op']}@{c['mesh_dim']} × {c['count']} = {_size(c['bytes'])}" for c in role["collectives_summary"]]
        lines.append(f"  {role['name']}: " + ("; ".join(parts) or "none"))
    step = data["step_time_s"]
    lines += ["", f"Step time on {plan.hardware.name}: compute {_seconds(step['compute'])}, communication "
              f"{_seconds(step['communication'])} -> between {_seconds(step['lower'])} (fully overlapped) and "
              f"{_seconds(step['upper'])} (not overlapped)"]  # fmt: skip
    mfu = data["mfu"]
    if mfu["best"] is not None:
        lines.append(f"MFU between {mfu['worst'] * 100:.1f}% and {mfu['best'] * 100:.1f}%")
    if "tokens_per_s" in data:
        tps = data["tokens_per_s"]
        lines.append(f"tokens/s between {tps['worst']:,.0f} and {tps['best']:,.0f} ({data['tokens_per_step']:,} tokens "
                     "per step)")  # fmt: skip
    return "\n".join(lines)
