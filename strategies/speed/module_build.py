"""Building the module a strategy will run: ``configure_model()`` then the root's ``init_weights()``.

:func:`build_module` runs the build in the strategy's init context. Where that context records a build on
``meta`` (sharded strategies) and the recording cannot reproduce it exactly (a call the replay cannot honour, or
code that fails on ``meta``, such as ``.item()`` on a weight), it does not guess: the build is undone
(:class:`~trainer.strategies.speed.build_undo.BuildUndo`) and run again eagerly, with real tensors, on the device
if the whole model fits there, else on the host if it fits there, saying so once with the memory it took; if it
fits nowhere the error names the construct and the ways out. Every rank takes the same road.

With ``check_init`` the build first runs eagerly once on the device (the one-device build), its tensors are kept
as the reference and the module is put back as it was; :func:`~trainer.strategies.speed.init_check.
verify_initial_weights` later compares every rank's materialised tensors with it.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_warn
from trainer.strategies.speed.build_undo import BuildUndo

_HEADROOM = 1.1  # an eager build must leave this factor of its size free


def build_module(module: nn.Module, build: Callable[[], None], init_context: Callable[[], ContextManager],
                 eager_context: Callable[[torch.device], ContextManager], device: torch.device,
                 check_init: bool = False) -> Optional[dict[str, torch.Tensor]]:  # fmt: skip
    """Run ``build`` in ``init_context()``, redone eagerly where a recorded build cannot be replayed exactly.
    Returns the eager reference tensors by name when ``check_init`` is true, else ``None``."""
    reference = eager_reference(module, build, eager_context, device) if check_init else None
    undo = BuildUndo(module, device)
    failure: Optional[BaseException] = None
    with undo:
        context = init_context()
        recording = getattr(context, "recording", None)
        try:
            with context:
                build()
        except Exception as err:
            if recording is None:
                raise
            failure = err
    if recording is None:
        return reference
    reasons = list(dict.fromkeys(recording.unhonoured))  # each construct once
    reason = f"{type(failure).__name__}: {failure}" if failure is not None else "; ".join(reasons[:3])
    if not _on_any_rank(bool(reason), device):
        return reference
    reason = reason or "another rank's build could not be recorded"
    # the model's size; a build that stopped part-way may not have attached what it made: all it had made then
    needed = _meta_bytes(module) if failure is None else max(_meta_bytes(module), _recorded_bytes(recording))
    undo.restore()
    where = _eager_device(needed, device)
    if where is None:
        raise ConfigurationError(
            f"configure_model() cannot be built on the meta device and replayed exactly ({reason}), and the whole "
            f"model ({_gib(needed)}) fits neither on {device} nor in this host's free memory to build it eagerly. "
            "Build it with empty_init semantics instead: define init_weights() on the module (it runs after the "
            "build; under a sharded strategy on each rank's shards), or write the initialisation with calls the "
            "replay supports (torch factories, torch.nn.init, in-place fills and arithmetic on the new tensors)."
        ) from failure
    rank_zero_warn(
        f"configure_model() could not be recorded on the meta device for an exact replay ({reason}); it was built "
        f"eagerly on {where} instead ({_gib(needed) if needed else 'its size unknown before the build'} per "
        "process), then sharded: the weights are exactly the eager build's.",
        stacklevel=2,
    )
    try:
        with eager_context(where):
            build()
    except Exception as err:
        if failure is not None:
            raise err from failure
        raise
    return reference


def eager_reference(module: nn.Module, build: Callable[[], None],
                    eager_context: Callable[[torch.device], ContextManager],
                    device: torch.device) -> dict[str, torch.Tensor]:  # fmt: skip
    """The tensors the build gives on one device, by name; the module is put back as it was."""
    undo = BuildUndo(module, device)
    with undo:
        with eager_context(device):
            build()
    reference = {}
    for name, tensor in itertools.chain(module.named_parameters(remove_duplicate=False),
                                        module.named_buffers(remove_duplicate=False)):  # fmt: skip
        # a build that shards while building (a TP plan in configure_model) gives DTensors: their whole value
        reference[name] = (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach()
    undo.restore()
    return reference


def _meta_bytes(module: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.is_meta and id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def _recorded_bytes(recording: Any) -> int:
    return sum(storage.numel * storage.ref.dtype.itemsize for storage in recording.storages.values())


def _eager_device(needed: int, device: torch.device) -> Optional[torch.device]:
    """The device if the whole model fits there (on every rank), else the host if it fits there, else None."""
    device = torch.device(device)
    on_device = device.type == "cuda" and needed * _HEADROOM < torch.cuda.mem_get_info(device)[0]
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    available = _host_available_bytes()
    on_host = available is None or needed * local_processes * _HEADROOM < available
    on_device = not _on_any_rank(not on_device, device)
    on_host = not _on_any_rank(not on_host, device)
    if on_device:
        return device
    return torch.device("cpu") if on_host else None


def _host_available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _on_any_rank(flag: bool, device: torch.device) -> bool:
    """``flag`` or-ed over every rank of the job (the local value without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return flag
    value = torch.tensor([int(flag)], device=device if torch.device(device).type == "cuda" else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _gib(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"
