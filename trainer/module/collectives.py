"""``TrainModule.all_gather``: gather every tensor of a (nested) batch-like structure from all processes."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trainer.strategies.errors import ConfigurationError


def _gather(tensor: Tensor, strategy: Any, sync_grads: bool) -> Tensor:
    if not sync_grads or strategy.world_size == 1:
        gathered = strategy.all_gather(tensor)
        return gathered if sync_grads else gathered.detach()
    from torch.distributed.nn.functional import all_gather  # differentiable: gradients go back to each rank

    return torch.stack(all_gather(tensor))


def all_gather_tree(data: Any, strategy: Any, group: Any = None, sync_grads: bool = False) -> Any:
    """Each tensor in ``data`` (lists, tuples, dicts) gathered to shape ``(world_size, *shape)``; numbers become
    tensors first, other values pass through. Every process must call it with the same structure."""
    if group is not None:
        raise ConfigurationError("all_gather(group=...) is not supported: it gathers over every process of the job.")
    if isinstance(data, Tensor):
        return _gather(data, strategy, sync_grads)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return _gather(torch.tensor(data, device=strategy.root_device), strategy, sync_grads)
    if isinstance(data, dict):
        return type(data)((k, all_gather_tree(v, strategy, None, sync_grads)) for k, v in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(all_gather_tree(v, strategy, None, sync_grads) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(all_gather_tree(v, strategy, None, sync_grads) for v in data)
    return data
