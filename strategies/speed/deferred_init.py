"""Deferred initialisation: build a module without memory (the ``meta`` device) or without random init, and
give each rank real memory for only the part it holds.

``Trainer.init_module()`` and ``TrainModule.configure_model()`` run inside :meth:`Strategy.module_init_context`,
which uses :func:`module_init_context` here:

- sharded strategies (``"fsdp"``, ``"nd_parallel"``, ...) build on ``meta``: no parameter has storage. The
  strategy shards (``fully_shard``, ``parallelize_module``, pipeline stages), then :func:`materialize` gives each
  rank storage for its own shards (``to_empty``) and initialises them: the module's ``init_weights()`` when the
  root defines one (torchtitan's convention), else every submodule's ``reset_parameters()`` (Lightning's);
- other strategies build on their device in the precision's dtype ("bf16-true": no float32 copy first);
  ``empty_init=True`` there skips ``torch.nn.init`` (the weights are about to be loaded from a checkpoint).
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, ContextManager, Optional

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
    """Where new modules' tensors go: ``meta`` (``meta=True``), else ``device`` with ``torch.nn.init`` skipped when
    ``empty_init`` is true; in both, floating tensors get the precision's weight dtype."""
    if empty_init is not None and not isinstance(empty_init, bool):
        raise ConfigurationError(f"empty_init={empty_init!r} must be True, False or None.")
    stack = contextlib.ExitStack()
    stack.enter_context(torch.device("meta") if meta else torch.device(device))
    stack.enter_context(precision.init_context())
    if empty_init and not meta:
        stack.enter_context(SkipInit())
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

    Runs after sharding, so each rank allocates and initialises only its shards. ``module.init_weights()`` is
    called if the root defines it; otherwise ``reset_parameters()`` of every submodule holding tensors, and a
    submodule without one is an error (its memory would stay uninitialised). ``seed``: initialise under this
    seed (the caller's random state is restored afterwards), e.g. a different one per rank so that shards differ.
    """
    if not has_meta_tensors(module):
        return False
    init_weights = getattr(module, "init_weights", None)
    if not callable(init_weights):
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
        if callable(init_weights):
            init_weights()
        else:
            for sub in module.modules():
                if _owns_tensors(sub):
                    sub.reset_parameters()
    return True
