"""Undo a module build, so that the same build can run again from where it started.

A build (``configure_model()`` and ``init_weights()``) is run twice when the first run cannot be used as it is: a
build on ``meta`` that the recording cannot reproduce is redone eagerly, and ``check_init`` builds eagerly once for
reference before the real build. :class:`BuildUndo` remembers, before the first run, the attributes of every module
of the tree (so modules the build assigned or replaced are dropped again), the random generators (Python's,
NumPy's, torch's CPU and GPU ones), and while active (a ``TorchFunctionMode``) the contents of the module's existing
tensors the build writes in place or rebinds (``param.data = ...``); :meth:`BuildUndo.restore` puts all of it back.
"""
from __future__ import annotations

import random
import sys
from typing import Any, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from trainer.strategies.speed.init_recording import inplace_target

_DATA = torch._C.TensorBase.data


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


class BuildUndo(TorchFunctionMode):
    """Snapshot of ``module``'s tree and the generators at construction; ``with`` it while building."""

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        super().__init__()
        # each module's class (fully_shard changes it), attributes, and the contents of its dicts (parameters,
        # buffers, submodules, hooks: parallelize_module adds some)
        self._modules = [(m, m.__class__, dict(m.__dict__),
                          {name: dict(value) for name, value in m.__dict__.items() if isinstance(value, dict)})
                         for m in module.modules()]  # fmt: skip
        states = _composable_states()
        self._sharded_before = {id(m) for m, *_ in self._modules if states is not None and m in states}
        existing = [t for t in list(module.parameters()) + list(module.buffers())]
        self._tensors = {id(t) for t in existing}
        self._storages = {_key(t) for t in existing if type(t) in (torch.Tensor, nn.Parameter) and not t.is_meta}
        self._saved_storages: dict[int, tuple[Any, Any]] = {}
        self._saved_data: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._rng = _generators(device)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DATA and getattr(func, "__name__", "") == "__set__" and args:
            if id(args[0]) in self._tensors:
                self._saved_data.append((args[0], args[0].data))
        else:
            target = inplace_target(getattr(func, "__name__", ""), args, kwargs)
            if isinstance(target, torch.Tensor) and type(target) in (torch.Tensor, nn.Parameter) and not target.is_meta:
                key = _key(target)
                if key in self._storages and key not in self._saved_storages:
                    storage = target.untyped_storage()
                    self._saved_storages[key] = (storage, storage.clone())
        return func(*args, **kwargs)

    def restore(self) -> None:
        """Put the tree, the existing tensors' contents and the generators back as they were at construction."""
        with torch.no_grad():
            for storage, saved in self._saved_storages.values():
                storage.copy_(saved)
            for tensor, data in reversed(self._saved_data):
                tensor.data = data
        states = _composable_states()
        for module, cls, attributes, dicts in self._modules:
            module.__class__ = cls
            module.__dict__.clear()
            module.__dict__.update(attributes)
            for name, saved in dicts.items():
                live = attributes[name]
                live.clear()
                live.update(saved)
            if states is not None and id(module) not in self._sharded_before:
                states.pop(module, None)  # fully_shard's state of a module it sharded while building
        _set_generators(self._rng)
        self._saved_storages, self._saved_data = {}, []


def _composable_states() -> Optional[Any]:
    """torch.distributed's registry of the states of composable APIs (``fully_shard``) by module, if loaded."""
    composable = sys.modules.get("torch.distributed._composable_state")
    return getattr(composable, "_module_state_mapping", None)


def _generators(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_generators(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
