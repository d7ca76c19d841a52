"""One training micro-batch: automatic optimisation (forward, backward, step at the window's end) or
manual optimisation (the user's ``training_step`` calls ``manual_backward`` and ``optimizer.step()``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from torch import Tensor
from torch.optim import Optimizer

from strategies.errors import ConfigurationError
from trainer.hooks import overrides
from trainer.module import TrainModule
from trainer.optimizers import step_schedulers
from trainer.step_signature import takes_batch_idx

if TYPE_CHECKING:  # pragma: no cover
    from trainer.trainer import Trainer


def extract_loss(output: Any) -> Optional[Tensor]:
    """The loss in ``training_step``'s return value, or ``None`` to skip; anything else is an error."""
    if isinstance(output, Tensor):
        loss = output
    elif output is None:
        return None
    elif isinstance(output, dict) and "loss" in output:
        loss = output["loss"]
        if loss is None:
            return None
    else:
        raise ConfigurationError(
            f"training_step returned {type(output).__name__} {output!r:.120}; in automatic optimisation it must "
            "return a loss tensor, a dict with a 'loss' key, or None to skip the optimizer step for this batch."
        )
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ConfigurationError(
            f"training_step returned a loss of {shape}; it must be a scalar tensor (e.g. reduce it with .mean())."
        )
    return loss


class StepCounter:
    """Shared bookkeeping after an optimizer step: global step, skipped steps, step-interval schedulers."""

    def __init__(self, trainer: "Trainer") -> None:
        self.trainer = trainer
        self.step_schedulers = [c for c in trainer.lr_scheduler_configs if c.interval == "step"]

    def after_step(self, stepped: bool) -> None:
        progress = self.trainer.fit_loop.progress
        progress.global_step += 1
        if not stepped:
            progress.skipped_steps += 1  # an fp16 step skipped for inf/nan gradients: schedulers wait too
        elif self.step_schedulers:
            step_schedulers(self.step_schedulers, "step", progress.global_step, lambda: self.trainer.callback_metrics)


class AutomaticOptimization:
    """Forward, backward (``no_sync`` inside an accumulation window) and, at the window's end, the step.

    The loss is divided by ``accumulate_grad_batches`` for every micro-batch, including a partial window
    at the end of an epoch (as Lightning and Accelerate do), so a hand-written loop with the usual
    ``(loss / accumulate).backward()`` gives the same weights.
    """

    def __init__(self, trainer: "Trainer", optimizer: Optional[Optimizer]) -> None:
        self.trainer = trainer
        self.strategy = trainer.strategy
        self.optimizer = optimizer
        self.accumulate = trainer.accumulate_grad_batches
        hooks = trainer._hooks
        self.before_backward = hooks.caller(trainer, "on_before_backward")
        self.after_backward = hooks.caller(trainer, "on_after_backward")
        self.before_optimizer_step = hooks.caller(trainer, "on_before_optimizer_step")
        self.before_zero_grad = hooks.caller(trainer, "on_before_zero_grad")
        self.counter = StepCounter(trainer)
        module = trainer.module
        self.clip_val = trainer.gradient_clip_val
        self.clip_algorithm = trainer.gradient_clip_algorithm
        self.custom_clipping = overrides(module, TrainModule, "configure_gradient_clipping")
        self.pass_batch_idx = takes_batch_idx(module.training_step)  # training_step(batch) is allowed, as in Lightning
        self.window_has_loss = False
        self.loss_check = trainer._faults.guard  # records the loss on device; None skips the micro-batch
        # on_train_batch_end gets {"loss": detached loss, **other keys} as in Lightning; built only if it is used.
        self.report_outputs = hooks.caller(trainer, "on_train_batch_end") is not None
        self._before_step: Callable[[], None] = self._hooks_and_clipping

    def run(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        strategy = self.strategy
        with strategy.backward_sync(window_end):
            output = strategy.training_step(batch, batch_idx) if self.pass_batch_idx else strategy.training_step(batch)
            loss = extract_loss(output)
            if self.report_outputs and loss is not None:
                output = {**output, "loss": loss.detach()} if isinstance(output, dict) else {"loss": loss.detach()}
            if loss is not None and self.loss_check is not None:
                loss = self.loss_check(loss)
            if loss is not None:
                if self.accumulate > 1:
                    loss = loss / self.accumulate
                if self.before_backward is not None:
                    self.before_backward(loss)
                try:
                    strategy.backward(loss)
                except RuntimeError as err:
                    if "does not require grad" in str(err):
                        raise ConfigurationError(
                            "The loss returned by training_step does not require grad: it was detached, computed "
                            "under torch.no_grad(), or no parameter took part in it."
                        ) from err
                    raise
                if self.after_backward is not None:
                    self.after_backward()
                self.window_has_loss = True
        if window_end:
            if self.window_has_loss and self.optimizer is not None:
                self.step()
            self.window_has_loss = False
        return output

    def step(self) -> None:
        optimizer = self.optimizer
        stepped = self.strategy.optimizer_step(optimizer, self._before_step)
        if self.before_zero_grad is not None:
            self.before_zero_grad(optimizer)
        optimizer.zero_grad(set_to_none=True)
        self.counter.after_step(stepped)

    def _hooks_and_clipping(self) -> None:
        optimizer = self.optimizer
        if self.before_optimizer_step is not None:
            self.before_optimizer_step(optimizer)
        if self.custom_clipping:
            self.trainer.module.configure_gradient_clipping(optimizer, self.clip_val, self.clip_algorithm)
        elif self.clip_val:
            self.strategy.clip_gradients(optimizer, self.clip_val, self.clip_algorithm)


class ManualOptimization:
    """Calls ``training_step``; the user steps optimizers through the wrappers ``self.optimizers()`` returns."""

    def __init__(self, trainer: "Trainer") -> None:
        self.strategy = trainer.strategy
        self.pass_batch_idx = takes_batch_idx(trainer.module.training_step)

    def run(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        if self.pass_batch_idx:
            return self.strategy.training_step(batch, batch_idx)
        return self.strategy.training_step(batch)


class ManualOptimizer:
    """What ``self.optimizers()`` returns in manual optimisation: ``step()`` runs the precision plugin's
    step order (unscale → ``on_before_optimizer_step`` → step/skip → scaler update) and counts the step."""

    def __init__(self, optimizer: Optimizer, trainer: "Trainer") -> None:
        self._optimizer = optimizer
        self._trainer = trainer
        self._counter = StepCounter(trainer)
        self._counter.step_schedulers = []  # in manual optimisation the user steps schedulers

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped torch optimizer."""
        return self._optimizer

    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> None:
        """Step through the strategy/precision plugin; ``closure`` is supported except under 16-mixed."""
        trainer = self._trainer
        optimizer = self._optimizer
        stepped = trainer.strategy.optimizer_step(
            optimizer, lambda: trainer._call_hook("on_before_optimizer_step", optimizer), closure
        )
        self._counter.after_step(stepped)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients (after the ``on_before_zero_grad`` hook)."""
        self._trainer._call_hook("on_before_zero_grad", self._optimizer)
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"ManualOptimizer({self._optimizer!r})"
