"""Proof that materialisation wrote every element of every parameter and buffer it allocated.

``to_empty`` gives each rank memory for its shards that holds whatever was there before: zeros often, sometimes
NaN, sometimes small garbage that trains without complaint. :class:`WriteCoverage` watches every aten op while the
module is initialised (the replay of its recorded build, or ``init_weights()`` / ``reset_parameters()``) and marks,
element by element, which parts of the watched storages were overwritten: by a call that writes its whole target
(``copy_``, ``fill_``, ``zero_``, a random fill, an ``out=`` argument) or by an indexed write (``index_put_``,
``masked_fill_``, ``index_fill_``, ``scatter_``), mirrored on a mask. A read-modify-write (``add_``, ``mul_``)
marks nothing: garbage times two is still garbage. :meth:`WriteCoverage.unwritten` names what was not covered.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops (overload packets) that write every element of a mutated argument without reading it.
_WHOLE_WRITES = frozenset({
    "copy_", "fill_", "zero_", "uniform_", "normal_", "random_", "bernoulli_", "exponential_", "cauchy_",
    "log_normal_", "geometric_",
})  # fmt: skip


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _local(tensor: Any) -> Any:
    return getattr(tensor, "_local_tensor", tensor)


class WriteCoverage(TorchDispatchMode):
    """Context that records which elements of ``tensors`` ({name: plain tensor}) get written.

    A write of a whole watched tensor (or of its whole storage) is noted without memory; only a write of part of
    one allocates a mask of its storage's elements (FSDP's shards are views into padded storages, written whole)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.tensors = tensors
        self._numel: dict[int, int] = {}
        self._watched: dict[int, list[tuple[str, tuple]]] = {}  # storage key -> (name, geometry) of its tensors
        self._whole: set[str] = set()  # names written whole
        self._masks: dict[int, torch.Tensor] = {}  # storage key -> which elements were written (partial writes)
        for name, tensor in tensors.items():
            key = _storage_key(tensor)
            self._numel[key] = tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1)
            self._watched.setdefault(key, []).append((name, _geometry(tensor)))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            for written in value if isinstance(value, (list, tuple)) else (value,):
                local = _local(written)
                if isinstance(local, torch.Tensor) and not local.is_meta and _storage_key(local) in self._watched:
                    self._mark(func, local, args, argument.is_out)
        return out

    def _mark(self, func: Any, local: torch.Tensor, args: tuple, is_out: bool) -> None:
        name = func._overloadpacket.__name__
        key = _storage_key(local)
        if name in _WHOLE_WRITES or is_out:
            if local.numel() == self._numel[key] and local.is_contiguous():
                self._whole.update(watched for watched, _ in self._watched[key])
                return
            geometry = _geometry(local)
            exact = [watched for watched, shape in self._watched[key] if shape == geometry]
            if exact:
                self._whole.update(exact)
                return
            self._region(key, local).fill_(True)
            return
        try:  # an indexed write: the same call on the mask marks the elements it wrote
            region = self._region(key, local)
            if name == "index_put_":
                region.index_put_(tuple(_local(i) if i is not None else None for i in args[1]),
                                  torch.tensor(True, device=region.device))  # fmt: skip
            elif name in ("masked_fill_", "masked_scatter_"):
                region.masked_fill_(_local(args[1]), True)
            elif name == "index_fill_":
                region.index_fill_(args[1], _local(args[2]), True)
            elif name in ("scatter_", "scatter"):
                region.scatter_(args[1], _local(args[2]), True)
        except Exception:
            pass  # not followed: those elements count as unwritten, and the check below says so

    def _region(self, key: int, local: torch.Tensor) -> torch.Tensor:
        if key not in self._masks:
            self._masks[key] = torch.zeros(self._numel[key], dtype=torch.bool, device=local.device)
        return torch.as_strided(self._masks[key], local.size(), local.stride(), local.storage_offset())

    def unwritten(self) -> list[str]:
        """Names of the watched tensors with an element no call overwrote."""
        missing = []
        for name, tensor in self.tensors.items():
            if tensor.numel() == 0 or name in self._whole:
                continue
            mask = self._masks.get(_storage_key(tensor))
            if mask is None or not bool(torch.as_strided(mask, tensor.size(), tensor.stride(),
                                                         tensor.storage_offset()).all()):  # fmt: skip
                missing.append(name)
        return missing


def _geometry(tensor: torch.Tensor) -> tuple:
    return tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset(), tensor.dtype
