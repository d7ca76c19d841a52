"""Collectives on Python objects for a hand-written loop (Accelerate's ``gather_object``)."""
from __future__ import annotations

from typing import Any

import torch.distributed as dist


def gather_object(obj: Any) -> list[Any]:
    """Every process's ``obj`` (a list, or any picklable value), concatenated in rank order: lists are joined,
    other values become one item per process. In a single process ``obj`` comes back unchanged. Every process
    must call it."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, obj)
    if all(isinstance(part, (list, tuple)) for part in parts):
        return [item for part in parts for item in part]
    return parts
