"""Lightning 2.6's time-based ``val_check_interval`` ("DD:HH:MM:SS", a timedelta, a dict of its arguments) and the
loop progress members a Lightning user's callback reads (``fit_loop.total_batch_idx``, ``batch_progress``,
``epoch_loop.max_steps``, ``trainer.validate_loop``), on real fits of a tiny module; with them the two utilities
Lightning's loop tests import (``PossibleUserWarning``, ``has_len_all_ranks``).

The wall clock is the test's: ``training_step`` moves it on one second per batch, so where validation runs does
not depend on how often anything reads it."""
from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest

from trainer import Trainer
from trainer.demos.boring_classes import BoringModel
from trainer.strategies import ConfigurationError


class Clock:
    """A monotonic clock that only moves when told (``tick``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


class TimedModel(BoringModel):
    """Each training batch takes one (fake) second; records the batches validation ran after."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.validated_after: list[tuple[int, int]] = []  # (epoch, total batch index)
        self.step_batch_idx: list[int] = []

    def training_step(self, batch, batch_idx):
        self.clock.tick()
        self.step_batch_idx.append(self.trainer.fit_loop.total_batch_idx)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if not self.trainer.sanity_checking:
            self.validated_after.append((self.current_epoch, self.trainer.fit_loop.total_batch_idx))
        return super().validation_step(batch, batch_idx)


def fit_timed(clock: Clock, **kwargs) -> tuple[Trainer, TimedModel]:
    model = TimedModel(clock)
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=1, **kwargs)  # fmt: skip
    with mock.patch("time.monotonic", clock):
        trainer.fit(model)
    return trainer, model


@pytest.mark.parametrize("interval", ["00:00:00:03", timedelta(seconds=3), {"seconds": 3}])
def test_validation_runs_each_time_the_interval_has_passed(interval):
    trainer, model = fit_timed(Clock(), max_epochs=1, limit_train_batches=10, val_check_interval=interval)
    # 3 s after training started, then 3 s after each validation ended; no extra validation at the epoch's end
    assert model.validated_after == [(0, 2), (0, 5), (0, 8)]
    assert trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed == 3
    assert trainer.val_check_interval == interval  # kept as given, as in Lightning


def test_time_based_interval_waits_for_an_epoch_that_validates():
    # check_val_every_n_epoch=2: the interval passes in epoch 0, validation waits for epoch 1's first batch
    trainer, model = fit_timed(Clock(), max_epochs=2, limit_train_batches=4, val_check_interval={"seconds": 3},
                               check_val_every_n_epoch=2)  # fmt: skip
    assert model.validated_after == [(1, 4), (1, 7)]
    assert trainer.fit_loop.epoch_loop.val_loop.batch_progress.current.completed == 1


def test_progress_members_a_callback_reads():
    trainer, model = fit_timed(Clock(), max_epochs=2, limit_train_batches=3, val_check_interval=1.0)
    assert model.step_batch_idx == [0, 1, 2, 3, 4, 5]  # inside training_step: the running batch, across epochs
    loop = trainer.fit_loop
    assert loop.total_batch_idx == 5 and loop.batch_idx == 2  # after the fit: the last batch
    progress = loop.epoch_loop.batch_progress
    assert (progress.total.completed, progress.current.completed, progress.total.ready) == (6, 3, 6)
    assert progress.is_last_batch
    assert loop.epoch_loop.val_loop.batch_progress.total.completed == 1  # this epoch's validation batches
    assert loop.max_steps == loop.epoch_loop.max_steps == -1 and loop.max_epochs == 2
    assert "total_batches" in loop.state_dict()


def test_raising_max_steps_on_the_epoch_loop_continues_the_fit():
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, max_steps=2, limit_val_batches=0)  # fmt: skip
    model = BoringModel()
    trainer.fit(model)
    assert trainer.global_step == 2
    trainer.fit_loop.epoch_loop.max_steps += 1
    assert trainer.max_steps == 3
    trainer.fit(model)
    assert trainer.global_step == 3


def test_validate_test_and_predict_loops_count_their_batches():
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=3, limit_test_batches=2, limit_predict_batches=4)  # fmt: skip
    model = BoringModel()
    trainer.validate(model, verbose=False)
    trainer.validate(model, verbose=False)
    trainer.test(model, verbose=False)
    trainer.predict(model)
    validate = trainer.validate_loop.batch_progress
    assert (validate.current.completed, validate.total.completed, validate.is_last_batch) == (3, 6, True)
    assert trainer.test_loop.batch_progress.current.completed == 2
    assert trainer.predict_loop.batch_progress.current.completed == 4


def test_batch_count_intervals_never_read_the_clock_in_the_loops():
    calls = []
    real = time.monotonic

    def watched() -> float:
        import sys

        caller = sys._getframe(1).f_code.co_filename
        if "/trainer/loops/" in caller:
            calls.append(caller)
        return real()

    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, max_epochs=2, limit_train_batches=4, limit_val_batches=1,
                      val_check_interval=2)  # fmt: skip
    with mock.patch("time.monotonic", watched):
        trainer.fit(BoringModel())
    assert calls == []


@pytest.mark.parametrize("value", ["01:02:03", "aa:00:00:01", {"weeks_": 1}])
def test_a_malformed_duration_is_refused(value):
    with pytest.raises(ConfigurationError, match="val_check_interval=.* is not a valid time-based duration"):
        Trainer(val_check_interval=value)


def test_a_fraction_without_epoch_gating_is_refused_in_lightnings_words():
    with pytest.raises(ConfigurationError, match="`val_check_interval` should be an integer or a time-based duration"):
        Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)


def test_possible_user_warning_is_the_category_of_max_epochs_not_set():
    from trainer.utilities.warnings import PossibleUserWarning

    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, max_epochs=None, limit_train_batches=1, limit_val_batches=0)  # fmt: skip
    with pytest.warns(PossibleUserWarning, match="`max_epochs` was not set"):
        trainer.fit(BoringModel())
    assert issubclass(PossibleUserWarning, UserWarning) and trainer.max_epochs == 1000


def test_has_len_all_ranks_on_sized_and_unsized_loaders():
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from trainer.utilities.data import has_iterable_dataset, has_len_all_ranks

    class Stream(IterableDataset):
        def __iter__(self):
            yield from torch.zeros(4, 2)

    class StreamWithLen(Stream):
        def __len__(self):
            return 4

    strategy = Trainer(accelerator="cpu", logger=False).strategy
    assert has_len_all_ranks(DataLoader(torch.zeros(8, 2), batch_size=2), strategy)
    assert not has_len_all_ranks(DataLoader(Stream()), strategy)
    assert has_iterable_dataset(DataLoader(Stream())) and not has_iterable_dataset(DataLoader(torch.zeros(2, 2)))
    with pytest.warns(UserWarning, match="Your `IterableDataset` has `__len__` defined"):
        assert has_len_all_ranks(DataLoader(StreamWithLen()), strategy)
    with pytest.warns(UserWarning, match="Total length of `DataLoader` across ranks is zero"):
        assert has_len_all_ranks(DataLoader(torch.zeros(0, 2)), strategy)
