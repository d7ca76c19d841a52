"""Device maps: which device each part of a module lives on when one process splits it across devices.

A device map is ``{module name: device}``, e.g. ``{"encoder": "cuda:0", "decoder": "cuda:1"}``; ``""`` is the
whole module. Every parameter and buffer goes to the device of the longest name in the map that is its module
or an ancestor of it, so ``{"": 0, "decoder.layers.5": 1}`` puts one layer on device 1 and the rest on device 0.

:func:`plan_device_map` builds one automatically (``device_map="auto"``): it walks the module's children in
registration order (usually the order they run), fills the devices one after another with an even share of the
parameter and buffer bytes, never beyond a device's budget, and splits a child into its own children when the
child is larger than the space left. A part that cannot be split (a leaf, or a class in ``no_split``) and fits
on no device raises a :class:`ConfigurationError` naming it. A tensor shared by several modules (tied weights,
e.g. an output head sharing the embedding's weight) is counted once and placed with its first owner; the
modules sharing it are mapped to that device too (they run where the tensor is).
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence, Union

import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError

Budget = Union[None, int, str, Sequence[Union[int, str, None]]]
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_bytes(value: Union[int, float, str], name: str = "max_memory") -> int:
    """``80_000_000_000``, ``"80GB"``, ``"40 GiB"`` or ``"512MiB"`` as a number of bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return int(value)
    if isinstance(value, str):
        found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if found and found.group(2).lower() in _UNITS:
            return int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    raise ConfigurationError(
        f"{name}={value!r} is not a memory size. Use a positive number of bytes or a string such as '80GB' or '40GiB'."
    )


def format_bytes(count: float) -> str:
    """A byte count for people: ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1024
    return f"{count} B"  # pragma: no cover


def budgets(max_memory: Budget, count: int) -> list[float]:
    """One byte budget per device (``inf`` where none is set) from an int/str for all or a list per device."""
    if max_memory is None:
        return [math.inf] * count
    if isinstance(max_memory, (list, tuple)):
        if len(max_memory) != count:
            raise ConfigurationError(f"max_memory has {len(max_memory)} entries but there are {count} devices.")
        return [math.inf if v is None else float(parse_bytes(v)) for v in max_memory]
    return [float(parse_bytes(max_memory))] * count


def own_bytes(module: nn.Module, seen: set[int]) -> int:
    """Bytes of the parameters and buffers ``module`` holds directly and that ``seen`` has not counted yet."""
    total = 0
    for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def subtree_bytes(module: nn.Module) -> int:
    """Bytes of every parameter and buffer under ``module`` (shared tensors once)."""
    seen: set[int] = set()
    return sum(own_bytes(m, seen) for m in module.modules())


def plan_device_map(
    module: nn.Module,
    devices: Sequence[Any],
    max_memory: Budget = None,
    no_split: tuple[type, ...] = (),
    tied_copies: bool = False,
) -> dict[str, Any]:
    """``device_map="auto"``: fill ``devices`` in order with about equal shares of the module's bytes.

    ``max_memory`` caps the parameter and buffer bytes per device (an int or ``"20GB"`` for all, or a list).
    ``tied_copies``: count a shared tensor in every module that holds it and leave each module where the walk
    puts it (pipeline stages, which keep a copy each) instead of once, with its first owner (one process).
    Returns ``{module name: device}`` with entries in execution order.
    """
    count = len(devices)
    if count == 0:
        raise ConfigurationError("A device map needs at least one device.")
    caps = budgets(max_memory, count)
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    for name, sub in module.named_modules():
        sizes[name] = own_bytes(sub, set() if tied_copies else seen)
    total = {name: sum(size for other, size in sizes.items() if _within(other, name)) for name in sizes}
    plan: dict[str, Any] = {}
    used = [0] * count
    remaining = total[""]
    index = 0
    share = _share(remaining, count, 0, caps)
    queue: list[tuple[str, nn.Module, bool]] = [("", module, False)]  # (name, module, its own tensors only)
    while queue:
        name, sub, own_only = queue.pop(0)
        size = sizes[name] if own_only else total[name]
        if size == 0:
            continue  # no tensors: runs wherever its inputs are
        splittable = not own_only and next(sub.children(), None) is not None and not isinstance(sub, no_split)
        while True:
            room, filled = caps[index] - used[index], used[index]
            if size <= room and (filled + size <= share or index == count - 1):
                break  # within this device's fair share (the last device takes what its budget allows)
            if splittable:
                break
            if size <= room and (filled == 0 or filled + size / 2 <= share):
                break  # an unsplittable part: here if most of it falls within the share
            index += 1
            if index == count:
                raise _does_not_fit(name or type(module).__name__, size, caps, used, devices)
            share = _share(remaining, count, index, caps)
        if splittable and not (size <= caps[index] - used[index] and (used[index] + size <= share or index == count - 1)):
            queue[:0] = _parts(name, sub, sizes)
            continue
        plan[name] = devices[index]
        used[index] += size
        remaining -= size
    if not tied_copies:
        _place_tied(module, plan)
    return plan


def _place_tied(module: nn.Module, plan: dict[str, Any]) -> None:
    """A module holding a tensor that an earlier module owns (an output head tied to the embedding) goes to
    that tensor's device: one process holds a shared tensor once, and the module must run where it is."""
    home: dict[int, Any] = {}
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        owner = name.rpartition(".")[0]
        key = next((k for k in sorted(plan, key=len, reverse=True) if _within(owner, k)), None)
        device = home.setdefault(id(tensor), None if key is None else plan[key])
        if key is None or plan[key] != device:
            plan[owner] = device


def _within(name: str, ancestor: str) -> bool:
    return ancestor == "" or name == ancestor or name.startswith(ancestor + ".")


def _share(remaining: float, count: int, index: int, caps: list[float]) -> float:
    return min(caps[index], math.ceil(remaining / (count - index)))


def _parts(name: str, module: nn.Module, sizes: dict[str, int]) -> list[tuple[str, nn.Module, bool]]:
    """A split module becomes its own tensors (if any) followed by its children."""
    prefix = f"{name}." if name else ""
    parts = [(name, module, True)] if sizes[name] else []
    return parts + [(prefix + child_name, child, False) for child_name, child in module.named_children()]


def _does_not_fit(name: str, size: int, caps: list[float], used: list[int], devices: Sequence[Any]) -> ConfigurationError:
    free = ", ".join(f"{d}: {format_bytes(c - u) if c != math.inf else 'unlimited'}" for d, c, u in zip(devices, caps, used))
    return ConfigurationError(
        f"'{name}' needs {format_bytes(size)} but no device has that much of its max_memory left ({free}), and it "
        "cannot be split further (a single layer, or a class in no_split_module_classes). Raise max_memory, use more "
        "devices, or shard it with strategy='fsdp'."
    )


def resolve_device_map(module: nn.Module, device_map: dict[str, Any], devices: Sequence[torch.device]) -> dict[str, int]:
    """Validate an explicit map; its values (an index into ``devices``, ``"cuda:1"``, a device) become indices."""
    if not isinstance(device_map, dict) or not device_map:
        raise ConfigurationError(
            f"device_map={device_map!r} must be 'auto' or a non-empty dict {{submodule name: device}}, e.g. "
            "{'encoder': 0, 'decoder': 1}."
        )
    resolved: dict[str, int] = {}
    for name, device in device_map.items():
        try:
            module.get_submodule(name)
        except AttributeError:
            children = [n for n, _ in module.named_children()]
            raise ConfigurationError(
                f"device_map names '{name}', which is not a submodule of {type(module).__name__}. Its top-level "
                f"submodules are {children}; use dotted names for deeper ones and '' for the whole module."
            ) from None
        if isinstance(device, int) and not isinstance(device, bool):
            index = device
        else:
            try:
                index = list(devices).index(torch.device(device))
            except (RuntimeError, TypeError, ValueError):
                index = -1
        if not 0 <= index < len(devices):
            raise ConfigurationError(
                f"device_map['{name}']={device!r} is not one of the devices in use {[str(d) for d in devices]}; give "
                "one of them or its index."
            )
        resolved[name] = index
    return resolved


def tensor_devices(module: nn.Module, device_map: dict[str, Any]) -> dict[str, Any]:
    """The device of every parameter and buffer name under the longest-prefix rule; raises for uncovered
    tensors and for a tensor shared by modules mapped to different devices (tied weights)."""
    keys = sorted(device_map, key=len, reverse=True)
    placed: dict[str, Any] = {}
    by_tensor: dict[int, tuple[str, Any]] = {}
    uncovered = []
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        owner = name.rpartition(".")[0]
        key = next((k for k in keys if _within(owner, k)), None)
        if key is None:
            uncovered.append(name)
            continue
        placed[name] = device_map[key]
        first = by_tensor.setdefault(id(tensor), (name, device_map[key]))
        if first[1] != device_map[key]:
            raise ConfigurationError(
                f"'{first[0]}' and '{name}' are the same tensor (tied weights) but the device map puts them on "
                f"{first[1]} and {device_map[key]}. Map the modules that share it to one device."
            )
    if uncovered:
        raise ConfigurationError(
            f"The device map does not place {uncovered[:5]}{' ...' if len(uncovered) > 5 else ''}. Add their modules "
            "to it, or '' for everything not named."
        )
    return placed
