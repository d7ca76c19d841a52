"""``Fabric.save(path, state)`` / ``Fabric.load(path, state)``: a dict of set-up modules, optimizers, stateful
objects and plain values, written through the strategy as one file (global rank 0 writes; read back with
``weights_only=True``). Under FSDP (``state_dict_type="sharded"``, the default) it is a sharded folder instead, as
Lightning's Fabric writes: each rank writes its shards through the strategies' sharded checkpoint IO (DCP), the
modules' and optimizers' state dicts under the ``state_dict`` section, and each rank reads back only its shards. A
strategy with ``state_dict_type="full"`` gathers the state dicts whole into one file; every rank reads it and
keeps its own slice."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from torch import nn
from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.strategy import Strategy

ModuleOf = Callable[[Any], Optional[nn.Module]]


@contextlib.contextmanager
def whole_state_dicts(strategy: Strategy) -> Iterator[None]:
    """Inside: a sharded strategy gives full state dicts (on global rank 0) and writes single files."""
    before = getattr(strategy, "state_dict_type", None)
    if before == "sharded":
        strategy.state_dict_type = "full"
    try:
        yield
    finally:
        if before == "sharded":
            strategy.state_dict_type = before


def _optimizer(obj: Any) -> Optional[Optimizer]:
    """The torch optimizer behind ``obj`` (a set-up one wraps it), or None."""
    inner = getattr(obj, "optimizer", None)
    if isinstance(inner, Optimizer):
        return inner
    return obj if isinstance(obj, Optimizer) else None


def state_of(state: dict[str, Any], module_of: ModuleOf, strategy: Strategy) -> dict[str, Any]:
    """``state`` with modules and optimizers replaced by their state dicts (full or sharded, as the strategy
    checkpoints them) and other objects with ``state_dict()`` by theirs. Every rank must call it."""
    if not isinstance(state, dict):
        raise TypeError(f"fabric.save(path, state) needs a dict as state, e.g. {{'model': model, 'optimizer': "
                        f"optimizer}}; got {type(state).__name__}. (Fabric's order is save(path, state).)")  # fmt: skip
    converted: dict[str, Any] = {}
    for key, value in state.items():
        module = module_of(value)
        optimizer = _optimizer(value)
        if module is not None:
            converted[key] = strategy.module_state_dict(module)
        elif isinstance(value, nn.Module):
            converted[key] = value.state_dict()
        elif optimizer is not None:
            converted[key] = strategy.optimizer_state_dict(optimizer)
        elif callable(getattr(value, "state_dict", None)) and not isinstance(value, type):
            converted[key] = value.state_dict()
        else:
            converted[key] = value
    return converted


def sharded_entries(converted: dict[str, Any]) -> list[str]:
    """The keys of ``converted`` whose state dicts hold DTensor shards (FSDP's, tensor parallel's)."""
    from trainer.strategies.checkpoint.sharded_checkpoint import flatten_tensors, is_dtensor

    return [key for key, value in converted.items()
            if isinstance(value, dict) and any(is_dtensor(t) for t in flatten_tensors(value).values())]  # fmt: skip


def save_sharded_state(strategy: Strategy, path: Union[str, os.PathLike], converted: dict[str, Any],
                       sharded: list[str]) -> None:  # fmt: skip
    """Write ``converted`` as a sharded folder at ``path``: the ``sharded`` entries as DCP shards, the rest global
    rank 0's. Every rank must call it."""
    from trainer.strategies.checkpoint.sharded_checkpoint import save_sharded

    if "state_dict" in converted:
        raise ConfigurationError("fabric.save: under a sharded strategy the key 'state_dict' is taken by the folder's "
                                 "shards; rename that entry of the state (e.g. 'model_state').")  # fmt: skip
    checkpoint = {key: value for key, value in converted.items() if key not in sharded}
    checkpoint["state_dict"] = {key: converted[key] for key in sharded}
    save_sharded(strategy, checkpoint, Path(path))
    strategy.barrier("fabric.save")


def load_sharded_state(strategy: Strategy, path: Path, state: Optional[dict[str, Any]],
                       module_of: ModuleOf) -> dict[str, Any]:  # fmt: skip
    """Read the sharded folder ``path``: the entries ``state`` names into this rank's shards of its set-up modules
    and optimizers (as they are now), anything else whole. Every rank must call it."""
    from trainer.strategies.checkpoint.sharded_checkpoint import load_sharded

    def templates(sections: dict[str, Any]) -> dict[str, Any]:
        wanted: dict[str, Any] = {}
        for key in sections.get("state_dict", {}):
            obj = (state or {}).get(key)
            if obj is not None and module_of(obj) is not None:
                wanted[key] = strategy.module_state_dict(module_of(obj))
            elif obj is not None and _optimizer(obj) is not None:
                wanted[key] = strategy.optimizer_state_dict(_optimizer(obj))
        return {"state_dict": wanted}

    checkpoint = load_sharded(path, templates)
    return {**checkpoint.pop("state_dict", {}), **checkpoint}


def save_state(strategy: Strategy, path: Union[str, os.PathLike], converted: dict[str, Any]) -> None:
    """Write ``converted`` to ``path`` through the strategy, then wait for every rank."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"fabric.save(path, state) needs a path first; got {type(path).__name__}. Fabric's order is "
                        "save(path, state) (Accelerate's is save(obj, path)).")  # fmt: skip
    target = Path(path)
    if strategy.is_global_zero:
        target.parent.mkdir(parents=True, exist_ok=True)
    strategy.save_checkpoint(converted, target)
    strategy.barrier("fabric.save")


def load_state(strategy: Strategy, path: Union[str, os.PathLike], state: Optional[dict[str, Any]], strict: bool,
               module_of: ModuleOf, raw: bool = False) -> dict[str, Any]:  # fmt: skip
    """Read ``path`` and restore it into ``state`` (see ``Fabric.load``); returns the entries ``state`` did not
    ask for (the whole file without ``state``)."""
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"fabric.load: '{target}' does not exist (written by fabric.save(path, state)?).")
    from trainer.strategies.checkpoint.sharded_checkpoint import is_sharded_checkpoint

    if is_sharded_checkpoint(target):
        if raw:
            raise ConfigurationError(f"fabric.load_raw: '{target}' is a sharded folder (fabric.save's under FSDP); "
                                     "load it with fabric.load(path, state).")  # fmt: skip
        checkpoint = load_sharded_state(strategy, target, state, module_of)
    else:
        checkpoint = strategy.load_checkpoint(target)
    if raw:
        checkpoint = {"_raw": checkpoint}
    if state is None:
        return checkpoint
    if strict:
        for key in state:
            if key not in checkpoint:
                raise KeyError(
                    f"The requested state contains a key '{key}' that does not exist in the loaded checkpoint "
                    f"'{target}' (it has {sorted(checkpoint)}). To disable strict loading, set `strict=False`."
                )
    for key, obj in list(state.items()):
        if key not in checkpoint:
            continue
        value = checkpoint.pop(key)
        module = module_of(obj)
        optimizer = _optimizer(obj)
        if module is not None:
            strategy.load_module_state_dict(value, strict=strict, module=module)
        elif isinstance(obj, nn.Module):
            obj.load_state_dict(value, strict=strict)
        elif optimizer is not None:
            strategy.load_optimizer_state_dict(optimizer, value)
        elif callable(getattr(obj, "load_state_dict", None)) and not isinstance(obj, type):
            obj.load_state_dict(value)
        else:
            state[key] = value
    strategy.barrier("fabric.load")
    return checkpoint
