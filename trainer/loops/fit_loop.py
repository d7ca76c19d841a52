"""The fit loop. This docstring is the one place where the order of every hook is written down.

``trainer.fit(module, data)``::

    strategy.setup_environment()                 # process group, device, precision checks
    datamodule.prepare_data()                    # local rank 0 only
    setup(stage="fit")                           # datamodule → callbacks → module
    configure_model()                            # only if overridden; once per module, in the strategy's init context
    strategy.setup_module(module)                # precision conversion, device, DDP/FSDP wrapping, materialising
    [restore ckpt_path, first half]              # module.on_load_checkpoint(checkpoint) (may edit it), weights,
                                                 # datamodule state, callbacks' on_load_checkpoint, load_state_dict,
                                                 # loop progress
    configure_optimizers() → strategy.setup_optimizers(...)
    [warning if submodules are in eval mode: each keeps its own mode, as in Lightning]
    on_fit_start                                 # callbacks → module
    module.zero_grad()
    [restore ckpt_path, second half]             # optimizers, schedulers, scaler, accumulated gradients
    [sanity check]                               # on_sanity_check_start, val_dataloader(), validation loop,
                                                 # on_sanity_check_end
    train_dataloader()                           # (earlier if something read trainer.train_dataloader)
    on_train_start
    [restored fit: the saved RNG is put back]
    for epoch in epochs:
        [reload_dataloaders_every_n_epochs epochs after the last request: train_dataloader() again]
        on_train_epoch_start
        for batch_idx, batch in train data:      # batch_idx counts micro-batches
            on_train_batch_start(batch, batch_idx)        # returning -1 ends the epoch early
            [the window's last micro-batch, with optimizer_step overridden: optimizer_step(epoch, batch_idx,
             optimizer, closure) runs, and optimizer.step(closure) runs the closure, the lines up to the step]
            training_step(batch, batch_idx)               # precision forward context; no_sync mid-window
            [first micro-batch of a window, when optimizer_step, optimizer_zero_grad or on_before_zero_grad
             is implemented: on_before_zero_grad(optimizer) → optimizer_zero_grad(epoch, batch_idx, optimizer)]
            on_before_backward(loss) → backward → on_after_backward
            if the accumulation window ends (every accumulate_grad_batches micro-batches, or the epoch's last):
                [16-mixed: unscale gradients, once]
                on_before_optimizer_step(optimizer)       # sees true gradients
                clip gradients (gradient_clip_val / configure_gradient_clipping)
                optimizer.step()                          # skipped by the scaler on inf/nan gradients
                [no zero-grad hook implemented: zero_grad(set_to_none=True) now, freeing memory for the forward]
                global_step += 1; step-interval LR schedulers (not after a skipped step)
            [the epoch's last batch: epoch-interval LR schedulers other than ReduceLROnPlateau]
            on_train_batch_end(outputs, batch, batch_idx)
            step metrics to loggers every log_every_n_steps optimizer steps
            [after a step, at agreed steps: stop signals → save interrupted.ckpt, exit; non-finite loss → stop]
            if val_check_interval is reached, or should_stop is set (and min_epochs/min_steps are met) in an epoch
            that validates: [at a window's end: on_validation_model_zero_grad, where gradients outlived the step
            (zero-grad hooks, manual optimisation) or it is overridden] validation loop (below)
            [after a step: step-interval ReduceLROnPlateau schedulers, which see this batch's and validation's metrics]
            stop at max_steps, or if should_stop
        on_train_epoch_end                          # other callbacks → module → monitoring callbacks
                                                    # (ModelCheckpoint, EarlyStopping, Timer, the progress bar), after
                                                    # ReduceLROnPlateau epoch schedulers step (epoch reached its end);
                                                    # checkpoints saved by these resume at the next epoch
        epoch metrics to loggers
        stop at max_epochs / max_steps, or on should_stop once min_epochs is reached
    [pending stop signal / non-finite loss acted on]
    on_train_end
    on_fit_end
    teardown(stage="fit")                        # datamodule → callbacks → module

Validation loop (``validate()`` and ``test()`` run the same with ``test_*`` hooks)::

    [fit: val_dataloader() the first time, and again reload_dataloaders_every_n_epochs after the last request]
    on_validation_start                          # each submodule's mode recorded, module.eval(), gradients off
    on_validation_epoch_start
    for each dataloader, for each batch:
        on_validation_batch_start(batch, batch_idx, dataloader_idx)
        validation_step(batch, batch_idx[, dataloader_idx])
        on_validation_batch_end(outputs, batch, batch_idx, dataloader_idx)
    on_validation_epoch_end
    epoch metrics final, sent to loggers
    on_validation_end                            # then on_validation_model_train if overridden, else each
                                                 # submodule's recorded mode is put back

Between a module hook and the callbacks' hook of the same name, as in Lightning: callbacks run first, on
every hook but ``on_train_epoch_end`` (see above).
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Optional

from trainer.loops.progress import Progress
from trainer.loops.progress_views import EvalCounts, EvaluationLoopView
from trainer.strategies.rank import rank_zero_info
from trainer.loops.optimizers import step_schedulers

if TYPE_CHECKING:  # pragma: no cover
    from trainer.loops.host import LoopHost


class FitLoop:
    """Epochs of training with validation; owns the :class:`Progress` counters."""

    def __init__(self, trainer: "LoopHost") -> None:
        self.trainer = trainer
        self.progress = Progress()
        self._told_min_not_met = False
        self.epoch_loop: Any = None  # the TrainingEpochLoop of the running (or last) fit
        #: Validation inside fit as Lightning users read it (``fit_loop.epoch_loop.val_loop.batch_progress``).
        self.val_loop = EvaluationLoopView(EvalCounts())

    # Lightning's FitLoop members that users read or set: views over the Trainer's settings and the Progress.
    @property
    def max_epochs(self) -> Optional[int]:
        """``trainer.max_epochs`` (settable, e.g. to continue a finished fit for more epochs)."""
        return self.trainer.max_epochs

    @max_epochs.setter
    def max_epochs(self, value: Optional[int]) -> None:
        self.trainer.max_epochs = value

    @property
    def max_steps(self) -> int:
        """``trainer.max_steps`` (settable, e.g. ``fit_loop.max_steps += 10`` before fitting again)."""
        return self.trainer.max_steps

    @max_steps.setter
    def max_steps(self, value: int) -> None:
        self.trainer.max_steps = value

    @property
    def min_epochs(self) -> Optional[int]:
        """``trainer.min_epochs``."""
        return self.trainer.min_epochs

    @property
    def min_steps(self) -> Optional[int]:
        """``trainer.min_steps``."""
        return self.trainer.min_steps

    @property
    def total_batch_idx(self) -> int:
        """The running (or last finished) training batch's index, counted across epochs (Lightning's)."""
        return self.progress.total_batches - 1 + int(self.epoch_loop is not None and self.epoch_loop.batch_running)

    @property
    def batch_idx(self) -> int:
        """The running (or last finished) training batch's index in its epoch."""
        return self.epoch_loop.batch_idx if self.epoch_loop is not None else -1

    def state_dict(self) -> dict[str, Any]:
        """The loop counters as a checkpoint's ``loops["fit"]`` holds them (our layout, not Lightning's)."""
        return self.progress.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters saved by :meth:`state_dict`."""
        self.progress.load_state_dict(state)

    @property
    def combined_loader(self) -> Any:
        """The training data as the loop iterates it: the loader, or a ``CombinedLoader`` of several
        (``trainer.train_dataloader`` gives the loaders in the shape they were passed); requested if fit has not yet."""
        return self.trainer._training_data()

    @property
    def done(self) -> bool:
        """True when max_steps or max_epochs is reached, or a stop was requested and min_epochs is met."""
        trainer = self.trainer
        progress = self.progress
        if trainer.max_steps != -1 and progress.global_step >= trainer.max_steps:
            return True
        if trainer.max_epochs != -1 and progress.epoch >= trainer.max_epochs:
            return True
        if not trainer.should_stop:
            return False
        if trainer._can_stop(progress.epoch):
            return True
        if not self._told_min_not_met:  # once per fit, as Lightning: the stop request is not lost, only deferred
            self._told_min_not_met = True
            rank_zero_info("Trainer was signaled to stop but the required `min_epochs=%r` or `min_steps=%r` has not "
                           "been met. Training will continue...", trainer.min_epochs, trainer.min_steps)
        return False

    def run(self, epoch_loop: Any) -> None:
        """Run epochs until :attr:`done`. Assumes set-up (strategy, optimizers, restore) is complete. With
        ``limit_train_batches=0`` training is off: no epoch runs (``current_epoch`` stays), as in Lightning."""
        trainer = self.trainer
        progress = self.progress
        self.epoch_loop = epoch_loop
        self._told_min_not_met = False
        if trainer.limit_train_batches == 0:
            return
        if trainer._val_check_seconds is not None:  # a time-based val_check_interval counts from here
            trainer._last_val_time = time.monotonic()
        results = trainer._metrics.train
        results.epoch_level = True  # as in Lightning, on_train_start logs epoch values (of the first epoch)
        trainer._call_hook("on_train_start")
        results.epoch_level = False
        trainer._checkpoint.resume_point()  # a restored fit continues the saved RNG stream from here
        reload_every = trainer.reload_dataloaders_every_n_epochs
        first_epoch = True
        while not self.done:
            if reload_every:
                trainer._reload_fit_dataloaders()  # when reload_dataloaders_every_n_epochs epochs passed
            num_batches = trainer.num_training_batches
            if progress.batch_in_epoch == 0:
                if not first_epoch:  # the stage started empty; what on_train_start logged counts in the first epoch
                    results.reset_epoch()
                self.val_loop.counts.reset()
            first_epoch = False  # as in Lightning, it counts the validation batches of this epoch
            results.epoch_level = True
            trainer._call_hook("on_train_epoch_start")
            results.epoch_level = False
            epoch_loop.ended_epoch_batches = 0  # batch_progress.current counts this epoch's batches from here
            iterator = trainer._train_iterator(progress.epoch, progress.batch_in_epoch)
            reached_end = epoch_loop.run(iterator, num_batches)
            if (trainer.max_steps != -1 and progress.global_step >= trainer.max_steps
                    and progress.batch_in_epoch < num_batches):  # fmt: skip
                break  # max_steps stopped the epoch mid-way: the epoch did not end
            if (math.isinf(num_batches) and trainer._val_enabled and not progress.val_pending
                    and not epoch_loop.validated_on_stop):  # fmt: skip
                epoch_loop.release_gradients()
                trainer._run_validation_in_fit()  # epoch end of an unsized loader
            plateau = [c for c in trainer.lr_scheduler_configs if c.interval == "epoch" and c.reduce_on_plateau]
            self._end_epoch(plateau if reached_end and epoch_loop.optimization.steps_schedulers else [])
        trainer._faults.check()  # a signal or non-finite loss from the last steps is acted on before on_train_end
        trainer._call_hook("on_train_end")

    def _end_epoch(self, plateau_schedulers: list[Any]) -> None:
        """``on_train_epoch_end`` (see :meth:`HookDispatcher.train_epoch_end` for the order), ``ReduceLROnPlateau``
        schedulers of an epoch that reached its end, epoch metrics to the loggers."""
        trainer = self.trainer
        progress = self.progress
        results = trainer._metrics.train
        results.epoch_done = True
        results.epoch_level = True

        def after_module_hook() -> None:
            trainer._metrics.sync_train_epoch()  # every rank: sync_dist values reduced before anyone decides on them
            if plateau_schedulers:  # they see what the module logged; checkpoints saved next hold the stepped state
                step_schedulers(plateau_schedulers, "epoch", progress.epoch + 1, lambda: trainer.callback_metrics)
            progress.epoch_finished = True

        trainer._hooks.train_epoch_end(trainer, after_module_hook)
        trainer._metrics.log_train_epoch()
        results.epoch_done = False
        progress.epoch += 1
        self.epoch_loop.ended_epoch_batches = progress.batch_in_epoch
        progress.batch_in_epoch = 0
        progress.epoch_finished = False
