"""Host-to-GPU batch copies off the critical path: on a side stream, from pinned memory, without blocking the host.

The loop fetches batch N+1 while the GPU still runs the kernels it queued for batch N (it never waits for them
between steps), so a copy issued then on a second stream overlaps that compute; the compute stream waits for the
copy only where batch N+1's kernels start. Each copied tensor is marked as used on the compute stream
(``record_stream``), so the caching allocator does not hand its memory to the next copy while a kernel may still
read it. Copies are ``non_blocking``: from pinned memory (the Trainer and the Engine turn on the DataLoader's
``pin_memory`` on CUDA) they return at once. An object with its own ``.to`` is moved on the compute stream, since
its tensors cannot be marked.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class SideStreamCopy:
    """``copy(batch)``: ``batch`` (tensors in dicts, lists, tuples, namedtuples) on ``device``, copied on a side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._compute: Any = None

    def __call__(self, batch: Any) -> Any:
        self._compute = compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            moved = self._move(batch)
        compute.wait_stream(self.stream)
        return moved

    def _move(self, data: Any) -> Any:
        if isinstance(data, Tensor):
            moved = data.to(self.device, non_blocking=True)
            if moved is not data:
                moved.record_stream(self._compute)
            return moved
        if isinstance(data, dict):
            return type(data)((k, self._move(v)) for k, v in data.items())
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
            return type(data)(*(self._move(v) for v in data))
        if isinstance(data, (list, tuple)):
            return type(data)(self._move(v) for v in data)
        if hasattr(data, "to") and callable(data.to):
            with torch.cuda.stream(self._compute):
                return data.to(self.device)
        return data
