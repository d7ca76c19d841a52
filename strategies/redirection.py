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
        self._step = self._run_step  # bound once: nothing is allocated per call
        self._own: Any = None  # the instance's own forward during a call (e.g. a compiled one), else None

    def __call__(self, *args: Any) -> Any:
        attributes = self.module.__dict__
        self._own = attributes.get("forward")
        attributes["forward"] = self._step
        try:
            return self.wrapper(*args)
        finally:
            self._restore_forward()

    def _restore_forward(self) -> None:
        if self._own is None:
            self.module.__dict__.pop("forward", None)
        else:
            self.module.__dict__["forward"] = self._own

    def _run_step(self, *args: Any, **kwargs: Any) -> Any:
        # Restore the real forward before the step runs: the step usually calls self(x).
        self._restore_forward()
        return getattr(self.module, self.method)(*args, **kwargs)
