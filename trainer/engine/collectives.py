"""Collectives for a hand-written loop beyond the strategy's: Python objects (Accelerate's ``gather_object``),
splitting inputs between processes, padding tensors to the largest process's size."""
from __future__ import annotations

from typing import Any

import torch
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


def split_share(inputs: Any, processes: int, rank: int, apply_padding: bool = False) -> Any:
    """Process ``rank``'s contiguous share of ``inputs`` (list, tuple, tensor, or a dict of them, all as long):
    the first ``len % processes`` processes take one more; ``apply_padding`` repeats the last element so every
    share is as long."""
    if processes == 1:
        return inputs
    length = len(next(iter(inputs.values()))) if isinstance(inputs, dict) else len(inputs)
    if isinstance(inputs, dict) and any(len(value) != length for value in inputs.values()):
        raise ValueError("split_between_processes: every value of the dict must have the same length.")
    per_process, extras = divmod(length, processes)
    start = rank * per_process + min(rank, extras)
    stop = start + per_process + (rank < extras)
    longest = per_process + (extras > 0)

    def share(values: Any) -> Any:
        part = values[start:stop]
        if apply_padding and len(part) < longest:
            if isinstance(part, torch.Tensor):
                last = values[-1:]
                part = torch.cat([part, last.expand(longest - len(part), *last.shape[1:])])
            else:
                part = part + type(part)([values[-1]] * (longest - len(part)))
        return part

    return {key: share(value) for key, value in inputs.items()} if isinstance(inputs, dict) else share(inputs)


def pad_to_largest(strategy: Any, tensor: torch.Tensor, dim: int, pad_index: Any, pad_first: bool) -> torch.Tensor:
    """``tensor`` padded along ``dim`` with ``pad_index`` to the largest size any process has (one all-gather of
    the sizes)."""
    if tensor.dim() == 0 or strategy.world_size == 1:
        return tensor
    dim = dim % tensor.dim()
    sizes = strategy.all_gather(torch.tensor(tensor.shape, device=tensor.device))
    largest = int(sizes[:, dim].max())
    if largest == tensor.shape[dim]:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = largest
    padded = tensor.new_full(shape, pad_index)
    region = slice(largest - tensor.shape[dim], largest) if pad_first else slice(0, tensor.shape[dim])
    index = [slice(None)] * tensor.dim()
    index[dim] = region
    padded[tuple(index)] = tensor
    return padded
