"""One training micro-batch: automatic optimisation (forward, backward, step at the window's end) or
manual optimisation (the user's ``training_step`` calls ``manual_backward`` and ``optimizer.step()``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from torch import Tensor
from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_warn
from trainer.strategies.strategy import Strategy
from trainer.module.overrides import implements, overrides
from trainer.module.train_module import TrainModule
from trainer.loops.optimizers import step_schedulers
from trainer.loops.skip_agreement import agree_on_skip, can_return_none
from trainer.loops.step_signature import takes_batch_idx

if TYPE_CHECKING:  # pragma: no cover
    from trainer.loops.host import LoopHost


def extract_loss(output: Any) -> Optional[Tensor]:
    """The loss in ``training_step``'s return value, or ``None`` (no backward); anything else is an error."""
    if isinstance(output, Tensor):
        if output.ndim == 0:  # the usual scalar loss: nothing more to check
            return output
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
            "return a loss tensor, a dict with a 'loss' key, or None to skip the backward for this batch."
        )
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ConfigurationError(
            f"training_step returned a loss of {shape}; it must be a scalar tensor (e.g. reduce it with .mean())."
        )
    return loss


def _outputs_with_loss(output: Any, loss: Tensor) -> dict[str, Any]:
    """What ``on_train_batch_end`` gets, as in Lightning: ``{"loss": detached loss, **training_step's other keys}``."""
    return {**output, "loss": loss.detach()} if isinstance(output, dict) else {"loss": loss.detach()}


def _explain_backward_error(err: RuntimeError) -> None:
    """Raise a ConfigurationError saying why, for the backward error of a loss that has no graph."""
    if "does not require grad" in str(err):
        raise ConfigurationError(
            "The loss returned by training_step does not require grad: it was detached, computed "
            "under torch.no_grad(), or no parameter took part in it."
        ) from err


class StepCounter:
    """Shared bookkeeping after an optimizer step: global step, skipped steps, step-interval schedulers.

    As in Lightning, step-interval ``ReduceLROnPlateau`` schedulers step later than the others: after the batch's
    ``on_train_batch_end`` and validation (they see its metrics); the epoch loop calls :meth:`step_plateau` then."""

    def __init__(self, trainer: "LoopHost") -> None:
        self.trainer = trainer
        self.step_schedulers: list[Any] = []
        self.plateau_schedulers: list[Any] = []
        self.refresh()

    def refresh(self) -> None:
        """Read the step-interval schedulers again (a callback may have replaced them, e.g. SWA's SWALR)."""
        configs = [c for c in self.trainer.lr_scheduler_configs if c.interval == "step"]
        self.step_schedulers = [c for c in configs if not c.reduce_on_plateau]
        self.plateau_schedulers = [c for c in configs if c.reduce_on_plateau]

    def after_step(self, stepped: Optional[bool]) -> None:
        """Count an optimizer step: ``stepped`` False for an fp16 step skipped for inf/nan gradients (counted, as in
        Lightning), None for a step that did not happen (a fault-tolerant quorum that did not commit: not counted)."""
        if stepped is None:
            return
        progress = self.trainer.fit_loop.progress
        progress.global_step += 1
        if not stepped:
            progress.skipped_steps += 1  # an fp16 step skipped for inf/nan gradients: schedulers wait too
            return
        if self.step_schedulers:
            step_schedulers(self.step_schedulers, "step", progress.global_step, lambda: self.trainer.callback_metrics)
        if self.plateau_schedulers:
            progress.plateau_pending = True  # saved in checkpoints: a resume steps them where this run would

    def step_plateau(self) -> None:
        """Step the step-interval ``ReduceLROnPlateau`` schedulers of the last step (after its batch's validation)."""
        progress = self.trainer.fit_loop.progress
        progress.plateau_pending = False
        saved, progress.plateau_metrics = progress.plateau_metrics, {}

        def metrics() -> dict[str, Any]:  # a resumed fit's validation values come from the checkpoint
            live = self.trainer.callback_metrics
            return {**saved, **live} if saved else live

        step_schedulers(self.plateau_schedulers, "step", progress.global_step, metrics)


class AutomaticOptimization:
    """Forward, backward (``no_sync`` inside an accumulation window) and, at the window's end, the step.

    The loss is divided by ``accumulate_grad_batches`` for every micro-batch, including a partial window
    at the end of an epoch (as Lightning and Accelerate do), so a hand-written loop with the usual
    ``(loss / accumulate).backward()`` gives the same weights.

    Gradients are cleared right after the optimizer step (their memory is free during the next forward) unless
    the module or a callback implements a hook that would see when: ``optimizer_step``, ``optimizer_zero_grad`` or
    ``on_before_zero_grad``. Then the order is Lightning's: the window's first ``training_step``, then
    ``on_before_zero_grad`` and ``optimizer_zero_grad``, then the backward; and an overridden ``optimizer_step``
    runs the window's last ``training_step`` and backward itself, through the closure it is given.
    """

    def __init__(self, trainer: "LoopHost", optimizer: Optional[Optimizer]) -> None:
        self.trainer = trainer
        self.strategy = trainer.strategy
        # A strategy that skips gradient synchronisation inside accumulation windows (DDP's no_sync) gets its context.
        self.sync_context = overrides(trainer.strategy, Strategy, "backward_sync")
        self.optimizer = optimizer
        self.accumulate = trainer.accumulate_grad_batches
        hooks = trainer._hooks
        self.before_backward = hooks.caller(trainer, "on_before_backward")
        self.after_backward = hooks.caller(trainer, "on_after_backward")
        self.before_optimizer_step = hooks.caller(trainer, "on_before_optimizer_step")
        self.before_zero_grad = hooks.caller(trainer, "on_before_zero_grad")
        self.counter = StepCounter(trainer)
        self.progress = trainer.fit_loop.progress
        module = trainer.module
        self.clip_val = trainer.gradient_clip_val
        self.clip_algorithm = trainer.gradient_clip_algorithm  # None when not set: what configure_gradient_clipping gets
        self.custom_clipping = overrides(module, TrainModule, "configure_gradient_clipping")
        self.pass_batch_idx = takes_batch_idx(module.training_step)  # training_step(batch) is allowed, as in Lightning
        # Several ranks, and a training_step that can return None: the ranks agree on a skip (skip_agreement).
        self.agree_skips = trainer.world_size > 1 and can_return_none(type(module).training_step)
        self.window_has_loss = False
        # The global step at the last training_step that returned None: equal to the current one while the window
        # has one. A window without a loss but with a None still takes its (empty) step, as in Lightning.
        self.none_at = -1
        #: Steps of windows whose every training_step returned None, in this fit (fit_outcome counts the others).
        self.empty_steps = 0
        self._warned_none = False
        self.guard = trainer._faults.guard
        self.loss_check: Optional[Callable[[Tensor], Optional[Tensor]]] = None  # set by runner()
        # on_train_batch_end gets {"loss": detached loss, **other keys} as in Lightning; built only if it is used.
        self.report_outputs = hooks.caller(trainer, "on_train_batch_end") is not None
        #: The loops step the LR schedulers (the epoch-interval ones in :mod:`trainer.loops.training_epoch_loop`).
        self.steps_schedulers = True
        self._before_step: Callable[[], None] = self._hooks_and_clipping
        #: What ``self.optimizers()`` returns and ``optimizer_step`` receives (Lightning's LightningOptimizer).
        self.wrapper = AutomaticOptimizer(self) if optimizer is not None else None
        # The module's own optimizer_step / optimizer_zero_grad (Lightning hooks, e.g. a learning-rate warm-up).
        self.custom_step = overrides(module, TrainModule, "optimizer_step")
        self.custom_zero_grad = overrides(module, TrainModule, "optimizer_zero_grad")
        self.zero_before_backward = self.custom_step or self.custom_zero_grad or self.before_zero_grad is not None
        #: Gradients outlive the step (Lightning's order): fit releases them before validating.
        self.keeps_gradients = self.zero_before_backward
        self.last_loss: Optional[Tensor] = None
        # The module's own backward(loss) hook, called (through the strategy) instead of loss.backward when overridden.
        self.module_backward = module.backward if overrides(module, TrainModule, "backward") else None
        # The module's backward_context() (e.g. loss_parallel()), entered around forward and backward; None if not given.
        self.backward_context = module.backward_context if implements(module, TrainModule, "backward_context") else None
        # Nothing between training_step and the torch calls would act: no hook of the step, clipping, custom step,
        # scheduler stepped per step, or strategy/precision layer (see Strategy.plain_steps).
        self.plain = (
            optimizer is not None and trainer.strategy.plain_steps and not self.custom_step
            and not self.custom_zero_grad and not self.custom_clipping and not self.clip_val
            and not self.counter.step_schedulers and not self.counter.plateau_schedulers
            and self.backward_context is None and self.module_backward is None
            and all(hook is None for hook in (self.before_backward, self.after_backward,
                                              self.before_optimizer_step, self.before_zero_grad))
        )  # fmt: skip

    def runner(self, accumulate: int) -> Callable[[Any, int, bool], Any]:
        """The step function for an epoch run with ``accumulate`` micro-batches per window: :meth:`run`, or the
        same step in fewer calls (:meth:`_run_plain`) when nothing between them would act."""
        self.accumulate = accumulate
        # A callback may have replaced the schedulers since (StochasticWeightAveraging's SWALR).
        self.counter.refresh()
        # The guard's check records or reads the loss (decided when the fit starts); None skips the micro-batch.
        self.loss_check = self.guard.check if self.guard is not None else None
        if not (self.plain and accumulate == 1) or self.agree_skips:
            return self.run
        training_step = self.strategy.module.training_step  # the module itself: plain strategies do not wrap it
        self._training_step = training_step if self.pass_batch_idx else (lambda batch, _: training_step(batch))
        return self._run_plain

    def run(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        if window_end and self.custom_step and self.wrapper is not None:
            return self.wrapper.run_step(batch, batch_idx)  # the module's optimizer_step runs the closure
        output = self.synced_forward_backward(batch, batch_idx, window_end)
        if window_end:
            if self.window_has_loss and self.optimizer is not None:
                self.step()
            elif self.none_at == self.progress.global_step and self.optimizer is not None:
                self.empty_step()
            self.window_has_loss = False
        return output

    def synced_forward_backward(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        """:meth:`forward_backward`, with gradient synchronisation only at the window's end, inside the module's
        ``backward_context()`` where it gives one (e.g. ``loss_parallel()``)."""
        if self.backward_context is not None:
            with self.backward_context():
                return self._synced_forward_backward(batch, batch_idx, window_end)
        return self._synced_forward_backward(batch, batch_idx, window_end)

    def _synced_forward_backward(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        if self.sync_context:
            with self.strategy.backward_sync(window_end):
                return self.forward_backward(batch, batch_idx)
        return self.forward_backward(batch, batch_idx)

    def forward_backward(self, batch: Any, batch_idx: int) -> Any:
        """``training_step`` and the backward of its loss; returns what ``training_step`` returned."""
        strategy = self.strategy
        output = strategy.training_step(batch, batch_idx) if self.pass_batch_idx else strategy.training_step(batch)
        loss = extract_loss(output)
        if self.agree_skips:  # raises unless every rank returned a loss, or every rank None
            agree_on_skip(strategy, loss is None, self.progress)
        if loss is None:
            output = self._returned_none(output)
        else:
            if self.report_outputs:
                output = _outputs_with_loss(output, loss)
            if self.loss_check is not None:
                loss = self.loss_check(loss)
        if self.zero_before_backward and batch_idx % self.accumulate == 0 and self.optimizer is not None:
            self.zero_grad(batch_idx)  # the window's first micro-batch, as in Lightning's closure
        self.last_loss = loss
        if loss is not None:
            if self.accumulate > 1:
                loss = loss / self.accumulate
            if self.before_backward is not None:
                self.before_backward(loss)
            try:
                if self.module_backward is None:
                    strategy.backward(loss)
                else:
                    strategy.backward_through(self.module_backward, loss)
            except RuntimeError as err:
                _explain_backward_error(err)
                raise
            if self.after_backward is not None:
                self.after_backward()
            self.window_has_loss = True
        return output

    def _run_plain(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        """:meth:`run` where every layer would only pass the call on (``self.plain``, one micro-batch per window):
        ``training_step``, the loss check, ``loss.backward()``, ``optimizer.step()``, ``zero_grad``, in one call."""
        output = self._training_step(batch, batch_idx)
        loss = output if output.__class__ is Tensor and not output.ndim else extract_loss(output)
        if loss is None:
            output = self._returned_none(output)
            self.empty_step()
            return output
        if self.report_outputs:
            output = _outputs_with_loss(output, loss)
        if self.loss_check is not None:
            loss = self.loss_check(loss)
            if loss is None:
                return output
        try:
            loss.backward()
        except RuntimeError as err:
            _explain_backward_error(err)
            raise
        optimizer = self.optimizer
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.progress.global_step += 1
        return output

    def step(self) -> None:
        stepped = self.strategy.optimizer_step(self.optimizer, self._before_step)
        if not self.zero_before_backward:
            self.optimizer.zero_grad(set_to_none=True)  # nobody sees when: free the gradients before the next forward
        self.counter.after_step(stepped)

    def _returned_none(self, output: Any) -> Any:
        """``training_step`` returned ``None``: as in Lightning, warn once and run no backward; the window's step is
        still taken. Returns what ``on_train_batch_end`` gets (Lightning's ``{}`` when anything reads it)."""
        if not self._warned_none:
            self._warned_none = True
            rank_zero_warn("`training_step` returned `None`. If this was on purpose, ignore this warning...")
        self.none_at = self.progress.global_step
        return {} if self.report_outputs else output

    def empty_optimizer_step(self, **kwargs: Any) -> None:
        """The optimizer step of a window whose every ``training_step`` returned ``None``, as Lightning takes it:
        ``on_before_optimizer_step``, clipping and the optimizer's step over whatever gradients there are (none).
        Under a gradient scaler (16-mixed) only the hook runs: Lightning skips the scaler's step when the closure
        gave no loss (and unscaling no gradients would mark the next real step's as already unscaled)."""
        self.empty_steps += 1
        scaler = getattr(self.strategy.precision, "scaler", None)
        if scaler is None or not scaler.is_enabled():
            self.strategy.optimizer_step(self.optimizer, self._before_step, **kwargs)
        elif self.before_optimizer_step is not None:
            self.before_optimizer_step(self.optimizer)

    def empty_step(self) -> None:
        """:meth:`empty_optimizer_step`, counted as a step: ``global_step`` goes up, step-interval schedulers step."""
        self.empty_optimizer_step()
        self.counter.after_step(True)

    def zero_grad(self, batch_idx: int) -> None:
        """``on_before_zero_grad`` then ``optimizer_zero_grad`` (the module's, or ``zero_grad(set_to_none=True)``)."""
        optimizer = self.optimizer
        if self.before_zero_grad is not None:
            self.before_zero_grad(optimizer)
        if self.custom_zero_grad:
            self.trainer.module.optimizer_zero_grad(self.trainer.current_epoch, batch_idx, optimizer)
        else:
            optimizer.zero_grad(set_to_none=True)

    def _hooks_and_clipping(self) -> None:
        optimizer = self.optimizer
        if self.before_optimizer_step is not None:
            self.before_optimizer_step(optimizer)
        if self.custom_clipping:
            self.trainer.module.configure_gradient_clipping(
                optimizer, gradient_clip_val=self.clip_val, gradient_clip_algorithm=self.clip_algorithm
            )
        elif self.clip_val:
            self.strategy.clip_gradients(optimizer, self.clip_val, self.clip_algorithm or "norm")


_NOT_RUN = object()


#: The imitating classes made so far, one per (wrapper class, optimizer class).
_IMITATING: dict[tuple[type, type], type] = {}


def _rebuild_wrapper(plain: type, state: dict[str, Any]) -> "OptimizerWrapper":
    wrapper = object.__new__(plain)
    wrapper.__dict__.update(state)
    wrapper._imitate()
    return wrapper


class OptimizerWrapper:
    """What ``self.optimizers()`` returns (Lightning's ``LightningOptimizer``, the base of both wrappers below): the
    torch optimizer's attributes, with ``step``/``zero_grad`` going through the Trainer; ``.optimizer`` is the torch
    optimizer. As in Lightning, a wrapper is an instance of its optimizer's class too (``isinstance(opt,
    torch.optim.Adam)``; its class is named ``LightningAdam``). ``LightningOptimizer(optimizer)`` built by hand
    passes ``step``/``zero_grad``/``state_dict``/``load_state_dict`` straight to ``optimizer``."""

    def __init__(self, optimizer: Optimizer) -> None:
        self._optimizer = optimizer
        self._imitate()

    def _imitate(self) -> None:
        """Make this wrapper's class a subclass of the optimizer's too (once per pair of classes)."""
        plain = type(self).__dict__.get("_plain_class", type(self))
        key = (plain, type(self.optimizer))
        cls = _IMITATING.get(key)
        if cls is None:
            cls = _IMITATING[key] = type(f"Lightning{key[1].__name__}", key, {"_plain_class": plain,
                                                                              "__module__": plain.__module__})
        self.__class__ = cls

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped torch optimizer."""
        return self._optimizer

    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Any:
        """The torch optimizer's ``step`` (the Trainer's wrappers step through the strategy instead)."""
        return self.optimizer.step(closure=closure, **kwargs) if closure is not None else self.optimizer.step(**kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # The optimizer class's own versions would act on the wrapper's (missing) state: go to the optimizer.
    def state_dict(self) -> dict[str, Any]:
        """The torch optimizer's ``state_dict()``."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the torch optimizer."""
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the torch optimizer."""
        self.optimizer.add_param_group(param_group)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_optimizer", "_automatic"):  # not set (yet): no delegation loop
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"Lightning{self.optimizer!r}"

    def __reduce__(self) -> Any:  # the imitating class is made at run time: pickle as the plain wrapper
        return _rebuild_wrapper, (type(self).__dict__.get("_plain_class", type(self)), dict(self.__dict__))


class AutomaticOptimizer(OptimizerWrapper):
    """The optimizer as ``self.optimizers()`` returns it in automatic optimisation and as ``optimizer_step`` receives
    it (Lightning's ``LightningOptimizer``): ``param_groups``, ``state`` and the rest are the torch optimizer's;
    ``step(closure)`` runs the closure (the step's ``training_step`` and backward) then steps through the strategy
    (unscale → ``on_before_optimizer_step`` → clip → step). A closure evaluated several times (LBFGS) needs manual
    optimisation."""

    def __init__(self, automatic: AutomaticOptimization) -> None:
        self._automatic = automatic
        self._stepped: Optional[bool] = None
        self._closure_calls = 0
        self._output: Any = _NOT_RUN
        self._batch: Any = None
        self._batch_idx = 0
        self._imitate()

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped torch optimizer."""
        return self._automatic.optimizer

    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> None:
        """Run ``closure`` (if given), then step through the strategy; when the window's ``training_step`` calls
        returned ``None`` and no loss, the empty step Lightning takes (no step when there was neither)."""
        if closure is not None:
            closure()
        automatic = self._automatic
        if automatic.window_has_loss:
            self._stepped = automatic.strategy.optimizer_step(automatic.optimizer, automatic._before_step, **kwargs)
        elif automatic.none_at == automatic.progress.global_step:
            automatic.empty_optimizer_step(**kwargs)
            self._stepped = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients."""
        self._automatic.optimizer.zero_grad(set_to_none=set_to_none)

    def run_step(self, batch: Any, batch_idx: int) -> Any:
        """The window's last micro-batch under the module's ``optimizer_step(epoch, batch_idx, optimizer, closure)``;
        returns what ``training_step`` returned."""
        automatic = self._automatic
        trainer = automatic.trainer
        self._stepped, self._closure_calls, self._output = None, 0, _NOT_RUN
        self._batch, self._batch_idx = batch, batch_idx
        try:
            trainer.module.optimizer_step(trainer.current_epoch, batch_idx, self, self._closure)
        finally:
            self._batch = None
        if self._output is _NOT_RUN:
            raise ConfigurationError(
                "optimizer_step did not run the closure it was given: it runs this step's training_step and backward. "
                "Call optimizer.step(closure=optimizer_closure); to skip the step, call optimizer_closure() alone."
            )
        automatic.window_has_loss = False
        if self._stepped is not None:  # a module that skipped optimizer.step() took no step
            automatic.counter.after_step(self._stepped)
        return self._output

    def _closure(self) -> Optional[Tensor]:
        self._closure_calls += 1
        if self._closure_calls > 1:
            raise ConfigurationError(
                "optimizer_step: the closure was called more than once (an LBFGS-style optimizer). With automatic "
                "optimisation the forward and backward run once per step; use manual optimisation "
                "(self.automatic_optimization = False) to re-evaluate the loss inside optimizer.step(closure)."
            )
        automatic = self._automatic
        self._output = automatic.synced_forward_backward(self._batch, self._batch_idx, True)
        loss = automatic.last_loss
        return loss.detach() if loss is not None else None



class ManualOptimization:
    """Calls ``training_step``; the user steps optimizers through the wrappers ``self.optimizers()`` returns."""

    def __init__(self, trainer: "LoopHost") -> None:
        self.strategy = trainer.strategy
        self.pass_batch_idx = takes_batch_idx(trainer.module.training_step)
        #: As in Lightning, the user steps every scheduler in manual optimisation: the loops step none.
        self.steps_schedulers = False
        #: The user clears the gradients: fit releases them before validating.
        self.keeps_gradients = True
        module = trainer.module
        self.backward_context = module.backward_context if implements(module, TrainModule, "backward_context") else None

    def runner(self, accumulate: int) -> Callable[[Any, int, bool], Any]:
        """The step function for an epoch (the user steps, so accumulation changes nothing here)."""
        return self.run if self.backward_context is None else self._run_in_context

    def _run_in_context(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        with self.backward_context():
            return self.run(batch, batch_idx, window_end)

    def run(self, batch: Any, batch_idx: int, window_end: bool) -> Any:
        if self.pass_batch_idx:
            return self.strategy.training_step(batch, batch_idx)
        return self.strategy.training_step(batch)


class ManualOptimizer(OptimizerWrapper):
    """What ``self.optimizers()`` returns in manual optimisation: ``step()`` runs the precision plugin's
    step order (unscale → ``on_before_optimizer_step`` → step/skip → scaler update) and counts the step."""

    def __init__(self, optimizer: Optimizer, trainer: "LoopHost") -> None:
        self._optimizer = optimizer
        self._trainer = trainer
        self._counter = StepCounter(trainer)
        self._counter.step_schedulers = self._counter.plateau_schedulers = []  # the user steps them (manual)
        self._imitate()

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped torch optimizer."""
        return self._optimizer

    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> None:
        """Step through the strategy/precision plugin; ``closure`` is supported except under 16-mixed; ``kwargs``
        go to the torch optimizer's ``step``, as in Lightning."""
        trainer = self._trainer
        optimizer = self._optimizer
        stepped = trainer.strategy.optimizer_step(
            optimizer, lambda: trainer._call_hook("on_before_optimizer_step", optimizer), closure, **kwargs
        )
        self._counter.after_step(stepped)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. As in Lightning, ``on_before_zero_grad`` is not called here: it belongs to automatic
        optimisation, where the loop clears the gradients."""
        self._optimizer.zero_grad(set_to_none=set_to_none)

