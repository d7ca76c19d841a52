"""Run a module's step method through the forward of the wrapper around it (DDP, and later FSDP).

A wrapper such as ``DistributedDataParallel`` does its work around ``forward`` (preparing the gradient
all-reduce for the backward that follows), but the Trainer calls ``training_step``, not ``forward``. For
the duration of one call, the module's ``forward`` is pointed at the step method, and the wrapper is
called: the wrapper's pre/post-forward runs around the step, as it would around a forward. A forward the
instance already has (one ``compile=`` or activation checkpointing installed) is put back before the step runs.
"""
from __future__ import annotations

from typing import Any

from torch import nn


class ForwardRedirection:
    """``redirect(*args)`` returns ``module.<method>(*args)``, computed inside ``wrapper(*args)``."""

    def __init__(self, wrapper: nn.Module, module: nn.Module, method: str) -> None:
        self.wrapper = wrapper
        self.module = module
        self.method = method
        # Made once (nothing is allocated per call) and holding no reference back to this object: a cycle would
        # keep the wrapper, and a DDP reducer's process group with it, alive after the stage until a garbage
        # collection, possibly at interpreter exit, where destroying a gloo group aborts the process.
        self._step = _StepAsForward(module, method)

    def __call__(self, *args: Any) -> Any:
        step = self._step
        step.own = self.module.__dict__.get("forward")
        self.module.__dict__["forward"] = step
        try:
            return self.wrapper(*args)
        finally:
            step.restore()


class _StepAsForward:
    """Stands in for the module's ``forward`` during one call: puts the real one back, then runs the step."""

    __slots__ = ("module", "method", "own")

    def __init__(self, module: nn.Module, method: str) -> None:
        self.module = module
        self.method = method
        self.own: Any = None  # the instance's own forward during a call (e.g. a compiled one), else None

    def restore(self) -> None:
        if self.own is None:
            self.module.__dict__.pop("forward", None)
        else:
            self.module.__dict__["forward"] = self.own

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.restore()  # the step usually calls self(x): that must be the real forward
        return getattr(self.module, self.method)(*args, **kwargs)
