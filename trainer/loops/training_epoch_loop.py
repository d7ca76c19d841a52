"""One training epoch: batches, optimizer steps, step logging and in-epoch validation.

The per-batch path does what a hand-written loop does plus a handful of attribute reads: no
allocation, no host-device sync and no collective of its own.
"""
from __future__ import annotations

import itertools
import math
import time
import warnings
from typing import TYPE_CHECKING, Any, Iterator

from trainer.strategies.errors import ConfigurationError
from trainer.data.batch_transfer import batch_mover
from trainer.data.combined_loader import DataLoaderIter
from trainer.loops.progress_views import BatchProgress, Tracker
from trainer.loops.step_signature import takes_dataloader_iter
from trainer.loops.optimizers import step_schedulers
from trainer.module.overrides import overrides
from trainer.module.train_module import TrainModule

if TYPE_CHECKING:  # pragma: no cover
    from trainer.loops.host import LoopHost

_END = object()


class TrainingEpochLoop:
    """Runs the micro-batches of one epoch. See :mod:`trainer.loops.fit_loop` for the hook order."""

    def __init__(self, trainer: "LoopHost", optimization: Any) -> None:
        self.trainer = trainer
        self.optimization = optimization
        #: The last :meth:`run` validated because a stop was requested (so the epoch's end does not validate again).
        self.validated_on_stop = False
        self.is_last_batch = False  # the running batch is the epoch's last (``trainer.is_last_batch``)
        #: A batch is between its fetch and its counters' update (what Lightning's ``ready`` counts already).
        self.batch_running = False
        self._warned_none_batch = False
        #: The batches of the epoch that ended last, until the next epoch's batches start (Lightning's ``current``
        #: counts still read them in ``on_train_epoch_end``, the next ``on_train_epoch_start`` and after the fit).
        self.ended_epoch_batches = 0
        #: Lightning's ``batch_progress``: ``total`` across epochs, ``current`` in this epoch (read-only).
        self.batch_progress = BatchProgress(Tracker(trainer.fit_loop.progress, "total_batches", self),
                                            Tracker(self, "batches_in_epoch", self), self)  # fmt: skip

    @property
    def batches_in_epoch(self) -> int:
        """Batches finished in the running epoch (or in the last one, between epochs)."""
        return self.trainer.fit_loop.progress.batch_in_epoch or self.ended_epoch_batches

    # Lightning's TrainingEpochLoop members that users read or set: views over the FitLoop's.
    @property
    def val_loop(self) -> Any:
        """Validation inside fit (``val_loop.batch_progress``)."""
        return self.trainer.fit_loop.val_loop

    @property
    def max_steps(self) -> int:
        """``trainer.max_steps`` (settable, e.g. ``epoch_loop.max_steps += 1`` before fitting again)."""
        return self.trainer.max_steps

    @max_steps.setter
    def max_steps(self, value: int) -> None:
        self.trainer.max_steps = value

    @property
    def min_steps(self) -> Any:
        """``trainer.min_steps``."""
        return self.trainer.min_steps

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (``trainer.global_step``)."""
        return self.trainer.fit_loop.progress.global_step

    @property
    def batch_idx(self) -> int:
        """The running (or last finished) batch's index in this epoch."""
        return self.batches_in_epoch - 1 + int(self.batch_running)

    @property
    def total_batch_idx(self) -> int:
        """The running (or last finished) batch's index, counted across epochs."""
        return self.trainer.fit_loop.total_batch_idx

    def val_check_batch(self, num_batches: float) -> int:
        """After how many micro-batches validation runs (0: never in this epoch)."""
        trainer = self.trainer
        if not trainer._val_enabled:
            return 0
        every_n = trainer.check_val_every_n_epoch
        if every_n is not None and (trainer.fit_loop.progress.epoch + 1) % every_n:
            return 0
        if trainer._val_check_seconds is not None:
            return 0  # time-based: the clock decides (see run)
        interval = trainer.val_check_interval
        if interval is None or (isinstance(interval, float) and interval == 1.0):
            return 0 if math.isinf(num_batches) else max(int(num_batches), 1)
        if isinstance(interval, float):
            if math.isinf(num_batches):
                raise ConfigurationError(
                    f"val_check_interval={interval} is a fraction of an epoch, but the training dataloader has no "
                    "length. Use an int number of batches, e.g. val_check_interval=1000."
                )
            return max(int(num_batches * interval), 1)
        if every_n is not None and interval > num_batches:
            raise ConfigurationError(
                f"val_check_interval={interval} exceeds the {int(num_batches)} training batches per epoch: it must be "
                "less than or equal to the number of the training batches. Use a smaller value, or "
                "check_val_every_n_epoch=None to count batches across epochs."
            )
        return interval

    def run(self, iterator: Any, num_batches: float) -> bool:
        """Consume ``iterator`` from ``progress.batch_in_epoch`` up to ``num_batches`` micro-batches. True when the
        epoch reached its end (its last batch, or ``on_train_batch_start`` returning -1), False when it stopped early
        (``max_steps``, ``should_stop``)."""
        trainer = self.trainer
        progress = trainer.fit_loop.progress
        results = trainer._metrics.train
        batch_start = trainer._hooks.caller(trainer, "on_train_batch_start")
        batch_end = trainer._hooks.caller(trainer, "on_train_batch_end")
        faults = trainer._faults
        accumulate = trainer.accumulate_grad_batches  # may change between epochs (GradientAccumulationScheduler)
        run_step = self.optimization.runner(accumulate)
        steps_every_batch = accumulate == 1
        log_every = trainer.log_every_n_steps
        stop_step = math.inf if trainer.max_steps == -1 else trainer.max_steps
        val_every = self.val_check_batch(num_batches)
        across_epochs = trainer.check_val_every_n_epoch is None
        every_n = trainer.check_val_every_n_epoch
        # As in Lightning, a stop requested mid-epoch still runs this epoch's validation (when it has one) first.
        validates_on_stop = trainer._val_enabled and (every_n is None or (progress.epoch + 1) % every_n == 0)
        # A time-based val_check_interval, in an epoch that validates: one clock read per batch (Lightning's rule:
        # validate once that much wall time passed since the last evaluation ended, or since training started).
        val_seconds = trainer._val_check_seconds if validates_on_stop else None
        # Epoch-interval schedulers other than ReduceLROnPlateau step at the epoch's last batch, before its
        # validation, as in Lightning (ReduceLROnPlateau at the epoch's end: FitLoop).
        epoch_schedulers = [c for c in trainer.lr_scheduler_configs if c.interval == "epoch" and not c.reduce_on_plateau
                            ] if self.optimization.steps_schedulers else []  # fmt: skip
        counter = getattr(self.optimization, "counter", None)  # step-interval ReduceLROnPlateau: after validation
        plateau = counter if counter is not None and counter.plateau_schedulers else None
        batch_idx = progress.batch_in_epoch
        reached_end = batch_idx >= num_batches
        self.validated_on_stop = False
        to_device = batch_mover(trainer)
        iterator_style = takes_dataloader_iter(trainer.module.training_step)
        if iterator_style:  # training_step(self, dataloader_iter): the step takes (and moves) its batches
            if accumulate > 1:
                raise ConfigurationError(
                    "training_step(self, dataloader_iter) takes its own batches, so the Trainer cannot tell where an "
                    f"accumulation window ends; accumulate_grad_batches={accumulate} needs training_step(self, batch)."
                )
            batches = _iterator_steps(DataLoaderIter(iterator, num_batches - batch_idx))
            to_device = None
        else:
            batches = _with_last_flag(iterator, num_batches - batch_idx)

        if progress.val_pending:  # resumed from a checkpoint saved between a batch and its validation
            trainer._run_validation_in_fit()
        if plateau is not None and progress.plateau_pending:  # ... or before that step's plateau schedulers
            plateau.step_plateau()

        for batch, is_last in batches:
            self.is_last_batch = is_last
            self.batch_running = True
            # A None batch (a collate_fn that drops one) skips the step, as in Lightning: no on_train_batch_start,
            # on_train_batch_end gets None.
            skip = batch is None and not iterator_style
            if skip:
                self._warn_none_batch()
            elif to_device is not None:
                batch = to_device(batch)
            results.batch = batch  # its size is inferred only if a logged value needs it
            if not skip and batch_start is not None and batch_start(batch, batch_idx) == -1:
                reached_end = True  # the epoch ends here, as if this were its last batch
                if epoch_schedulers:
                    step_schedulers(epoch_schedulers, "epoch", progress.epoch + 1, lambda: trainer.callback_metrics)
                break
            window_end = steps_every_batch or is_last or (batch_idx + 1) % accumulate == 0
            steps_before = progress.global_step
            try:
                outputs = None if skip else run_step(batch, batch_idx, window_end)
            except StopIteration:
                if not iterator_style:
                    raise
                break  # an iterator-style step asked for more batches than were left

            batch_idx += 1
            progress.batch_in_epoch = batch_idx
            progress.total_batches += 1
            self.batch_running = False
            step = progress.global_step
            stepped = step != steps_before
            if stepped:
                progress.batches_that_stepped += 1
            if val_every:
                counter = progress.total_batches if across_epochs else batch_idx
                progress.val_pending = counter % val_every == 0
            elif val_seconds is not None:
                progress.val_pending = time.monotonic() - trainer._last_val_time >= val_seconds
            if is_last:
                reached_end = True
                if epoch_schedulers:  # as in Lightning: before on_train_batch_end and the epoch's validation
                    step_schedulers(epoch_schedulers, "epoch", progress.epoch + 1, lambda: trainer.callback_metrics)
            if batch_end is not None:
                batch_end(outputs, batch, batch_idx - 1)

            if stepped and progress.batches_that_stepped % log_every == 0:
                trainer._metrics.log_step()
            # At a step boundary; for a signal in a single process (due_step 0) also at the end of a window that
            # did not step, so a run whose batches are all skipped still stops on SIGTERM.
            if step >= faults.due_step and (stepped or (window_end and not faults.due_step)):
                faults.check()  # before validation: a checkpoint saved here resumes with validation pending
            if validates_on_stop and trainer.should_stop and trainer._can_stop(progress.epoch):
                progress.val_pending = self.validated_on_stop = True  # this epoch's validation runs before the stop
            if progress.val_pending:
                if window_end:
                    self.release_gradients()
                trainer._run_validation_in_fit()
            if plateau is not None and progress.plateau_pending:
                plateau.step_plateau()
            if step >= stop_step or (trainer.should_stop and trainer._can_stop(progress.epoch)):
                break
        self.batch_running = False  # also after an early ``break`` (on_train_batch_start returned -1)
        return reached_end


    def _warn_none_batch(self) -> None:
        if not self._warned_none_batch:  # once per loop, as Lightning
            self._warned_none_batch = True
            warnings.warn("train_dataloader yielded None: its training_step is skipped (on_train_batch_end gets "
                          "outputs=None). If this was on purpose, ignore this warning.", UserWarning, stacklevel=3)

    def release_gradients(self) -> None:
        """Before a validation after a step: ``on_validation_model_zero_grad`` where the gradients outlived the step
        or the module overrides it (as in Lightning); elsewhere the loop already freed them."""
        module = self.trainer.module
        if self.optimization.keeps_gradients or overrides(module, TrainModule, "on_validation_model_zero_grad"):
            module.on_validation_model_zero_grad()


def _with_last_flag(iterator: Iterator[Any], remaining: float) -> Iterator[tuple[Any, bool]]:
    """``(batch, is_last)`` for at most ``remaining`` batches of ``iterator``. With a known length the flags come
    from the count (no work per batch in Python); without one, each batch is yielded once the next is fetched."""
    if not math.isinf(remaining):
        count = max(int(remaining), 0)
        flags = itertools.chain(itertools.repeat(False, count - 1), (True,))
        return zip(itertools.islice(iterator, count), flags)
    return _looking_ahead(iterator)


def _iterator_steps(dataloader_iter: DataLoaderIter) -> Iterator[tuple[Any, bool]]:
    """``(dataloader_iter, False)`` for each call of an iterator-style ``training_step``, until it is done."""
    while not dataloader_iter.done:
        yield dataloader_iter, False


def _looking_ahead(iterator: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    batch = next(iterator, _END)
    while batch is not _END:
        following = next(iterator, _END)
        yield batch, following is _END
        batch = following
