"""Gradient-norm clipping when the gradients are spread over a device mesh: DTensors of several meshes (FSDP's
data-parallel mesh, the 2-D data × tensor-parallel mesh), plain tensors, and pipeline stages on other ranks.

The total norm is the norm of every gradient of the whole model, whichever rank holds which part: each group of
DTensors on one mesh gives its full norm (torch reduces it over that mesh), the groups combine as a vector of
norms, and with pipeline parallel the stages' totals combine across the pipeline group.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor


def _by_mesh(parameters: list[Tensor]) -> list[list[Tensor]]:
    """Parameters with gradients, grouped by the mesh their gradient lives on (plain tensors together)."""
    groups: dict[Any, list[Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            groups.setdefault(id(getattr(p.grad, "device_mesh", None)), []).append(p)
    return list(groups.values())


def clip_grad_value_over_mesh(parameters: list[Tensor], clip_value: float) -> None:
    """Clamp every gradient to ``[-clip_value, clip_value]`` (torch's, one mesh at a time)."""
    for params in _by_mesh(parameters):
        torch.nn.utils.clip_grad_value_(params, clip_value)


def clip_grad_norm_over_mesh(
    parameters: list[Tensor], max_norm: float, norm_type: float = 2.0, pipeline_group: Optional[Any] = None
) -> Tensor:
    """Clip the gradients of ``parameters`` (this rank's part of the model) to a total norm of ``max_norm``;
    returns the total norm of the whole model's gradients, the same on every rank."""
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    norm_type = float(norm_type)
    groups = _by_mesh(parameters)
    norms = []
    for params in groups:
        norm = get_total_norm([p.grad for p in params], norm_type)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    device = norms[0].device if norms else (parameters[0].device if parameters else torch.device("cpu"))
    total = get_total_norm(norms, norm_type) if norms else torch.zeros((), device=device)
    if pipeline_group is not None:
        if math.isinf(norm_type):
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pipeline_group)
        else:
            total = total.pow(norm_type)
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pipeline_group)
            total = total.pow(1.0 / norm_type)
    for params in groups:
        clip_grads_with_norm_(params, max_norm, total)
    return total
