"""Pipeline stages: which stage each module and parameter of a module belongs to, from stage boundaries.

A split is given by its boundaries: the names of the modules that begin stages 1, 2, ... (torchtitan's
``pipeline_parallel_split_points``, ``torch.distributed.pipelining``'s ``SplitPoint.BEGINNING``). Walking the
modules in registration order (the order they usually run in), stage ``k`` holds what comes from boundary
``k`` up to boundary ``k+1``: for a GPT with boundaries ``["transformer.h.24"]``, stage 0 holds the embeddings
and blocks 0-23, stage 1 blocks 24-47, the final norm and the head. :func:`auto_boundaries` takes them from
the device-map planner (:func:`trainer.strategies.nd.device_map.plan_device_map`): stages balanced by bytes, blocks kept
whole.

Tied weights: a parameter used by modules on two stages (an embedding on the first, the head tied to it on
the last) is held by both, one copy each, as ``torch.distributed.pipelining`` replicates it; their gradients
must be summed across the two stages before the optimizer steps.
"""
from __future__ import annotations

from typing import Sequence

from torch import nn

from trainer.strategies.nd.device_map import plan_device_map
from trainer.strategies.errors import ConfigurationError


def auto_boundaries(module: nn.Module, stages: int, no_split: tuple[type, ...] = ()) -> list[str]:
    """Boundaries of ``stages`` stages balanced by parameter and buffer bytes (a tied weight counted on each
    stage that holds a copy), never inside a ``no_split`` class."""
    plan = plan_device_map(module, list(range(stages)), no_split=no_split, tied_copies=True)
    firsts: dict[int, str] = {}
    for name, stage in plan.items():
        firsts.setdefault(stage, name)
    missing = [k for k in range(1, stages) if k not in firsts]
    if missing:
        raise ConfigurationError(
            f"{type(module).__name__} cannot be split into {stages} pipeline stages: the device-map planner left "
            f"stage(s) {missing} empty (too few parts of similar size). Use fewer stages or smaller blocks."
        )
    return [firsts[k] for k in range(1, stages)]


def module_stages(module: nn.Module, boundaries: Sequence[str]) -> dict[str, int]:
    """``{module name: stage}`` for every module name (shared modules under each of their names)."""
    names = [name for name, _ in module.named_modules(remove_duplicate=False)]
    unknown = [b for b in boundaries if b not in names or b == ""]
    if unknown:
        raise ConfigurationError(
            f"Pipeline boundaries {unknown} are not submodules of {type(module).__name__}. Name the modules that "
            f"begin stages 1, 2, ... by their full path in the model: {_suggested_boundaries(module, names, boundaries)}"
        )
    order = {name: i for i, name in reversed(list(enumerate(names)))}
    positions = [order[b] for b in boundaries]
    if positions != sorted(set(positions)):
        raise ConfigurationError(
            f"Pipeline boundaries {list(boundaries)} must be distinct and in the order the modules are registered "
            "(the order they run in)."
        )
    stages: dict[str, int] = {}
    stage = 0
    for index, name in enumerate(names):
        while stage < len(positions) and index >= positions[stage]:
            stage += 1
        stages[name] = stage
    return stages


def _suggested_boundaries(module: nn.Module, names: list[str], boundaries: Sequence[str]) -> str:
    """The boundaries the user most likely meant: each name completed to the one module path ending in it
    (``"h.12"`` → ``"transformer.h.12"``), else a balanced split into as many stages."""
    completed = []
    for boundary in boundaries:
        if boundary in names and boundary:
            completed.append(boundary)
            continue
        matches = [n for n in names if boundary and n.endswith("." + boundary)]
        if len(matches) != 1:
            break
        completed.append(matches[0])
    else:
        return f"did you mean {completed}?"
    # the repeated blocks (children of a ModuleList) stay whole, as a user's split would keep them
    blocks = tuple({type(child) for m in module.modules() if isinstance(m, nn.ModuleList) for child in m})
    try:
        balanced = auto_boundaries(module, len(boundaries) + 1, no_split=blocks)
    except ConfigurationError:
        return f"the modules are {[n for n in names if n][:8]}, ..."
    return f"e.g. {balanced} (a split into {len(boundaries) + 1} stages of about equal size)."


def parameter_stages(module: nn.Module, boundaries: Sequence[str]) -> dict[str, int]:
    """``{parameter name: stage}`` for every parameter name (a tied parameter under each of its names, each on
    the stage of its module). Raises when a stage would hold no parameter."""
    owners = module_stages(module, boundaries)
    stages = {name: owners[name.rpartition(".")[0]] for name, _ in module.named_parameters(remove_duplicate=False)}
    empty = sorted(set(range(len(boundaries) + 1)) - set(stages.values()))
    if empty:
        raise ConfigurationError(
            f"Pipeline boundaries {list(boundaries)} leave stage(s) {empty} without parameters; move the boundaries."
        )
    return stages
