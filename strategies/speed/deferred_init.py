"""Deferred initialisation: build a module without memory (the ``meta`` device) or without random init, and
give each rank real memory for only the part it holds.

``Trainer.init_module()`` and ``TrainModule.configure_model()`` run inside :meth:`Strategy.module_init_context`,
which uses :func:`module_init_context` here:

- sharded strategies (``"fsdp"``, ``"nd_parallel"``, ...) build on ``meta``: no parameter has storage, and the
  initialisation the module's code performs is recorded (:mod:`trainer.strategies.speed.init_recording`). The
  strategy shards (``fully_shard``, ``parallelize_module``, pipeline stages), then :func:`materialize` gives each
  rank storage for its own shards (``to_empty``) and replays the recorded initialisation, keeping each rank's
  shards: the weights one device would have, bit for bit, on every layout. Then the root's ``init_weights()``
  runs if it defines one (torchtitan's convention). With ``empty_init=True`` nothing is recorded: the module is
  initialised by ``init_weights()``, else every submodule's ``reset_parameters()`` (Lightning's contract);
- other strategies build on their device in the precision's dtype ("bf16-true": no float32 copy first);
  ``empty_init=True`` there skips ``torch.nn.init`` (the weights are about to be loaded from a checkpoint).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from trainer.strategies.errors import ConfigurationError


class SkipInit(TorchFunctionMode):
    """``torch.nn.init.*`` calls return their tensor untouched: modules are built with uninitialised memory."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


def module_init_context(device: torch.device, precision: Any, empty_init: Optional[bool], meta: bool) -> ContextManager:
    """Where new modules' tensors go: ``meta`` (``meta=True``; recording the initialisation the code performs unless
    ``empty_init`` is true), else ``device`` with ``torch.nn.init`` skipped when ``empty_init`` is true; in both,
    floating tensors get the precision's weight dtype."""
    if empty_init is not None and not isinstance(empty_init, bool):
        raise ConfigurationError(f"empty_init={empty_init!r} must be True, False or None.")
    stack = contextlib.ExitStack()
    stack.enter_context(torch.device("meta") if meta else torch.device(device))
    stack.enter_context(precision.init_context())
    if empty_init and not meta:
        stack.enter_context(SkipInit())
    if meta and not empty_init:  # remember the module's own initialisation, replayed by materialize()
        from trainer.strategies.speed.init_recording import InitRecorder

        stack.enter_context(InitRecorder())
    return stack


def has_meta_tensors(module: nn.Module) -> bool:
    """True when any parameter or buffer of ``module`` (or its local shard) is on the ``meta`` device."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.is_meta:
            return True
    return False


def _owns_tensors(module: nn.Module) -> bool:
    return next(itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)), None) is not None


def materialize(module: nn.Module, device: torch.device, seed: Optional[int] = None) -> bool:
    """Give the ``meta`` tensors of ``module`` storage on ``device`` and initialise them; False if there were none.

    Runs after sharding, so each rank allocates only its shards. A module built while a sharded strategy recorded
    its construction (``configure_model``, ``Trainer.init_module()``) gets the values its own code computes, bit
    for bit as on one device (:mod:`trainer.strategies.speed.init_recording`), then ``init_weights()`` if the
    root defines one (torchtitan's convention). Otherwise (built with ``empty_init=True`` or on ``meta`` by hand)
    ``init_weights()`` or every submodule's ``reset_parameters()`` initialises it, and a submodule holding tensors
    without one is an error (its memory would stay uninitialised). Either way every ``torch.nn.init`` call and
    in-place random fill on a sharded tensor draws the full tensor, identically on every rank, and keeps the local
    shard: the weights do not depend on the layout. ``seed``: initialise under this seed (the caller's random
    state is restored afterwards).
    """
    from trainer.strategies.speed.init_recording import forget, origins_of, replay

    if not has_meta_tensors(module):
        return False
    origins = origins_of(module)
    meta_names = [name for name, tensor in _named_tensors(module) if _local(tensor).is_meta]
    recorded = bool(meta_names) and all(name in origins for name in meta_names)
    init_weights = getattr(module, "init_weights", None)
    if not recorded and not callable(init_weights):
        missing = sorted({type(sub).__name__ for sub in module.modules()
                          if _owns_tensors(sub) and not callable(getattr(sub, "reset_parameters", None))})  # fmt: skip
        if missing:
            raise ConfigurationError(
                f"{type(module).__name__} was built on the meta device (deferred initialisation), but {missing} "
                "hold parameters or buffers and define no reset_parameters(), so their memory would stay "
                "uninitialised. Give them reset_parameters(), define init_weights() on the module to initialise "
                "everything, or build eagerly with trainer.init_module(empty_init=False)."
            )
    module.to_empty(device=device)
    with torch.no_grad(), torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        if recorded:
            tensors = dict(_named_tensors(module))
            by_recording: dict[int, tuple[Any, dict]] = {}
            for name in meta_names:
                recording, ref = origins[name]
                targets = by_recording.setdefault(id(recording), (recording, {}))[1]
                targets.setdefault(ref.key, []).append((ref, _writer(tensors[name])))
            for recording, targets in by_recording.values():
                replay(recording, targets, device)
            forget(module)
            if all(recording.init_weights_recorded for recording, _ in by_recording.values()):
                init_weights = None  # replayed with the rest (record_init_weights)
        with FullTensorInit():
            if callable(init_weights):
                init_weights()
            elif not recorded:
                for sub in module.modules():
                    if _owns_tensors(sub):
                        sub.reset_parameters()
    return True


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _named_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    return itertools.chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False))


def _is_dtensor(tensor: Any) -> bool:
    return hasattr(tensor, "device_mesh") and hasattr(tensor, "placements")


def _write_local(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy into ``target`` its part of ``full`` (the whole of it, or a DTensor's local shard)."""
    if _is_dtensor(target):
        from torch.distributed.tensor import distribute_tensor

        full = full.to(target.to_local().device)
        shard = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
        target.to_local().copy_(shard)
    else:
        target.copy_(full)


def _on_full_tensor(init: Callable) -> Callable:
    def on_full(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not _is_dtensor(tensor):
            return init(tensor, *args, **kwargs)
        full = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.to_local().device)
        init(full, *args, **kwargs)
        _write_local(tensor, full)
        return tensor

    return functools.wraps(init)(on_full)


def _writer(target: torch.Tensor) -> Callable[[torch.Tensor], None]:
    return lambda full: _write_local(target, full)


class FullTensorInit(TorchFunctionMode):
    """``torch.nn.init.*`` calls and in-place random fills on a DTensor draw its full tensor (same on every rank,
    from the same generator state) and keep the local shard: one full parameter at a time, layout-independent."""

    def __enter__(self) -> "FullTensorInit":
        from trainer.strategies.speed.init_recording import _UNDISPATCHED_INITS

        # These do not dispatch to torch-function modes and draw by value (rejection sampling, a QR): on a DTensor
        # each rank would loop on its own shard's values; through the module attribute they run on the full tensor.
        self._patched = {name: getattr(nn.init, name) for name in _UNDISPATCHED_INITS}
        for name, original in self._patched.items():
            setattr(nn.init, name, _on_full_tensor(original))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        for name, original in self._patched.items():
            setattr(nn.init, name, original)
        return super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        from trainer.strategies.speed.init_recording import OVERWRITES, inplace_target

        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = inplace_target(name, args, kwargs)
        if target is None or not _is_dtensor(target) or name not in OVERWRITES or any(
            _is_dtensor(value) and value is not target for value in itertools.chain(args, kwargs.values())
        ):  # (a DTensor source: the code distributes its values itself)
            return func(*args, **kwargs)
        full = torch.empty(target.shape, dtype=target.dtype, device=target.to_local().device)
        swap = lambda value: full if value is target else value  # noqa: E731
        func(*[swap(a) for a in args], **{k: swap(v) for k, v in kwargs.items()})
        _write_local(target, full)
        return target
