"""``TrialSteps``: throw-away training steps for the finders, with everything put back afterwards."""
from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import Tensor

from trainer.callbacks.host import takes_batch_idx
from trainer.strategies.errors import ConfigurationError


def _cpu_copy(state: Any) -> Any:
    if isinstance(state, Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _cpu_copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_cpu_copy(v) for v in state)
    return copy.deepcopy(state)


class TunerExit(Exception):
    """Raised by a finder run from ``trainer.tuner.Tuner`` once its search is done: the fit the Tuner started ends
    there, cleanly (no training, no ``on_exception``), as Lightning's Tuner does."""


class TrialSteps:
    """Snapshot the module, optimizer, precision and RNG state on creation; :meth:`step` runs one full
    training step (forward, backward, optimizer step) through the strategy; :meth:`restore` undoes them all.

    Used from ``on_fit_start``, where the module and optimizers are set up but training has not begun.
    ``self.log`` calls inside trial steps are dropped. Single-process runs only: trials on several ranks
    would have to agree on every out-of-memory error.
    """

    def __init__(self, trainer: Any, module: Any) -> None:
        if not module.automatic_optimization or len(trainer.optimizers) != 1:
            raise ConfigurationError(
                "The batch-size and learning-rate finders need automatic optimisation with one optimizer (the "
                "finder only works with single optimizer)."
            )
        if trainer.world_size > 1:
            raise ConfigurationError("Run the batch-size and learning-rate finders on one device (devices=1), then "
                                     "use the values they find in the multi-device run.")  # fmt: skip
        self.trainer = trainer
        self.strategy = trainer.strategy
        self.optimizer = trainer.optimizers[0]
        self._step_args = (0,) if takes_batch_idx(module.training_step) else ()  # training_step(batch) is allowed
        self._module_state = _cpu_copy(trainer.strategy.module_state_dict())
        self._optimizer_state = _cpu_copy(self.optimizer.state_dict())
        self._precision_state = _cpu_copy(trainer.strategy.precision.state_dict())
        device = trainer.strategy.root_device
        self._rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        self._rng.__enter__()

    def step(self, batch: Any) -> Tensor:
        """One training step on ``batch``; returns the detached loss."""
        strategy = self.strategy
        batch = strategy.batch_to_device(batch)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"self\.log\(")
            output = strategy.training_step(batch, *self._step_args)
        loss = output["loss"] if isinstance(output, dict) else output
        if not isinstance(loss, Tensor):
            raise ConfigurationError("The finders need training_step to return a loss tensor (or a dict with 'loss').")
        strategy.backward(loss)
        strategy.optimizer_step(self.optimizer, lambda: None)
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def discard(self) -> None:
        """Drop gradients left by a failed step (e.g. out of memory)."""
        self.optimizer.zero_grad(set_to_none=True)

    def restore(self) -> None:
        """Put back the module weights, optimizer state (including learning rates), precision state and RNG."""
        self.discard()
        self.strategy.load_module_state_dict(self._module_state)
        self.strategy.load_optimizer_state_dict(self.optimizer, self._optimizer_state)
        self.strategy.precision.load_state_dict(self._precision_state)
        self._rng.__exit__(None, None, None)
