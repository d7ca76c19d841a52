"""``LocalSGD``: each process steps on its own gradients, and the processes average their parameters every
``local_sgd_steps`` optimizer steps (Accelerate's ``accelerate.local_sgd.LocalSGD``)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError


class LocalSGD:
    """Context manager for a training loop::

        with LocalSGD(accelerator=engine, model=model, local_sgd_steps=8) as local_sgd:
            for batch in loader:
                ...
                optimizer.step()
                local_sgd.step()      # every 8th call: parameters averaged over the processes

    Inside, the prepared model does not all-reduce gradients (DDP ``no_sync``); parameters are averaged with
    one all-reduce per tensor every ``local_sgd_steps`` calls of :meth:`step` and once more on leaving.
    ``enabled=False`` (or a single process) makes it do nothing.
    """

    def __init__(self, accelerator: Any, model: nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ConfigurationError(f"LocalSGD(local_sgd_steps={local_sgd_steps!r}) must be an int >= 1.")
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = bool(enabled) and accelerator.num_processes > 1
        self.num_steps = 0
        self._no_sync: Optional[Any] = None

    def __enter__(self) -> "LocalSGD":
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._average()
            self._no_sync.__exit__(*exc)
            self._no_sync = None

    def step(self) -> None:
        """Count one optimizer step; every ``local_sgd_steps``-th averages the parameters over the processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    @torch.no_grad()
    def _average(self) -> None:
        self.accelerator.wait_for_everyone()
        reduce = self.accelerator.strategy.reduce
        for param in self.accelerator.unwrap_model(self.model).parameters():
            param.data = reduce(param.data, "mean")
