"""``TrialSteps``: throw-away training steps for the finders, with everything put back afterwards."""
from __future__ import annotations

import copy
import warnings
from typing import Any, Optional

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

    def __init__(self, trainer: Any, module: Any, finder: str = "The batch-size and learning-rate finders") -> None:
        optimizers = len(trainer.optimizers)
        if not module.automatic_optimization or optimizers != 1:
            raise ConfigurationError(
                f"{finder} only works with single optimizer and automatic optimisation; configure_optimizers returned "
                f"{optimizers} and automatic_optimization is {module.automatic_optimization}."
            )
        _refuse_several_processes(trainer, finder)
        self.trainer = trainer
        self.strategy = trainer.strategy
        self.optimizer = trainer.optimizers[0]
        self._step_args = (0,) if takes_batch_idx(module.training_step) else ()  # training_step(batch) is allowed
        self._module_state = _cpu_copy(trainer.strategy.module_state_dict())
        self._optimizer_state = _cpu_copy(self.optimizer.state_dict())
        self._precision_state = _cpu_copy(trainer.strategy.precision.state_dict())
        self._progress = trainer.fit_loop.progress  # global_step counts the trial steps, as in Lightning's search
        self._global_step = self._progress.global_step
        self._rng = _fork_rng(trainer.strategy.root_device)

    def step(self, batch: Any) -> Optional[Tensor]:
        """One training step on ``batch``; returns the detached loss, or ``None`` when ``training_step`` returned
        ``None`` (the step is skipped, as in a fit)."""
        strategy = self.strategy
        batch = strategy.batch_to_device(batch)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"self\.log\(")
            output = strategy.training_step(batch, *self._step_args)
        loss = output.get("loss") if isinstance(output, dict) else output
        if loss is not None:
            if not isinstance(loss, Tensor):
                raise ConfigurationError("The finders need training_step to return a loss tensor, a dict with 'loss' "
                                         "or None (to skip the step).")  # fmt: skip
            strategy.backward(loss)
            strategy.optimizer_step(self.optimizer, lambda: None)
            self.optimizer.zero_grad(set_to_none=True)
            loss = loss.detach()
        self._progress.global_step += 1
        return loss

    def discard(self) -> None:
        """Drop gradients left by a failed step (e.g. out of memory)."""
        self.optimizer.zero_grad(set_to_none=True)

    def restore(self) -> None:
        """Put back the module weights, optimizer state (including learning rates), precision state and RNG."""
        self.discard()
        self.strategy.load_module_state_dict(self._module_state)
        self.strategy.load_optimizer_state_dict(self.optimizer, self._optimizer_state)
        self.strategy.precision.load_state_dict(self._precision_state)
        self._progress.global_step = self._global_step
        self._rng.__exit__(None, None, None)


class EvalTrialSteps:
    """Throw-away steps of validate, test or predict for the batch-size finder: ``validation_step``/``test_step``/
    ``predict_step`` on a batch (in the stage's no-grad mode, already on when its start hook runs), with what
    they ``self.log`` dropped; :meth:`restore` puts the random streams back. Single-process runs only."""

    _STEPS = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}

    def __init__(self, trainer: Any, module: Any, stage: str, finder: str = "The batch-size finder") -> None:
        _refuse_several_processes(trainer, finder)
        self.trainer = trainer
        self.strategy = trainer.strategy
        self.step_name = self._STEPS[stage]
        self._step_args = (0,) if takes_batch_idx(getattr(module, self.step_name)) else ()
        self._results = trainer._results
        trainer._results = None  # self.log in a trial step is dropped, not added to the stage's metrics
        self._rng = _fork_rng(trainer.strategy.root_device)

    def step(self, batch: Any) -> None:
        """One evaluation step on ``batch``."""
        batch = self.strategy.batch_to_device(batch)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"self\.log\(")
            self.strategy.evaluation_step(self.step_name, batch, *self._step_args)

    def discard(self) -> None:
        """Nothing to drop: evaluation steps keep no gradients."""

    def restore(self) -> None:
        """Put back where ``self.log`` writes and the random streams."""
        self.trainer._results = self._results
        self._rng.__exit__(None, None, None)


def _refuse_several_processes(trainer: Any, finder: str) -> None:
    if trainer.world_size > 1:
        raise ConfigurationError(f"{finder} is not supported with distributed strategies (several processes): run it "
                                 "on one device (devices=1), then use the value it finds in the multi-device run.")  # fmt: skip


def _fork_rng(device: torch.device) -> Any:
    rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    rng.__enter__()
    return rng
