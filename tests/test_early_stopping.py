"""EarlyStopping: when a fit stops, what it says, and that its count survives a resume."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

from trainer.callbacks import EarlyStopping, ModelCheckpoint
from ckpt_support import TinyRegressor, loaders, make_trainer
from trainer.strategies import SingleDeviceStrategy
from trainer.strategies.errors import ConfigurationError


def fit(root: Path, scores: list[float], *callbacks, ckpt_path=None, **kwargs):
    train, val = loaders()
    trainer = make_trainer(root, callbacks=list(callbacks), **{"max_epochs": 10, **kwargs})
    trainer.fit(TinyRegressor(val_scores=scores), train, val, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("scores, kwargs, epochs_run", [
    ([5, 4, 4.5, 4.2, 4.1, 1, 1], dict(patience=2), 4),  # no improvement at epochs 2 and 3
    ([5, 4.95, 4.9, 4.85, 1], dict(patience=1, min_delta=0.1), 2),  # improvements smaller than min_delta do not count
    ([0.5, 0.7, 0.95, 0.99], dict(mode="max", stopping_threshold=0.9, patience=10), 3),
    ([1, 2, 100, 0.5], dict(divergence_threshold=50, patience=10), 3),
    ([1, math.nan, 0.5, 0.4], dict(patience=10), 2),
    ([1, math.nan, 0.5, 0.4], dict(patience=10, check_finite=False), 10),
])  # fmt: skip
def test_stops_when_it_should(tmp_path: Path, scores, kwargs, epochs_run) -> None:
    stopper = EarlyStopping("val_loss", **kwargs)
    trainer = fit(tmp_path, scores, stopper, enable_checkpointing=False)
    assert trainer.current_epoch == epochs_run
    if epochs_run < 10:
        assert stopper.stopped_epoch == epochs_run - 1 and stopper.stopping_reason


def test_min_epochs_wins_over_a_stop_request(tmp_path: Path) -> None:
    trainer = fit(tmp_path, [5, 6, 7, 8, 9], EarlyStopping("val_loss", patience=1), enable_checkpointing=False,
                  min_epochs=4)  # fmt: skip
    assert trainer.current_epoch == 4


def test_patience_count_survives_a_resume(tmp_path: Path) -> None:
    scores = [5, 4, 4.5, 4.2, 4.1, 4.0, 3.9]
    checkpoints = lambda: ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)  # noqa: E731
    fit(tmp_path, scores, EarlyStopping("val_loss", patience=3), checkpoints(), max_epochs=3)
    stopper = EarlyStopping("val_loss", patience=3)
    trainer = fit(tmp_path, scores, stopper, checkpoints(), ckpt_path="last")
    assert trainer.current_epoch == 5  # waits at epochs 2, 3, 4: a fresh count would run until epoch 5
    assert stopper.best_score == 4 and stopper.wait_count == 3


def test_a_finished_stop_is_resumed_as_finished(tmp_path: Path) -> None:
    checkpoints = lambda: ModelCheckpoint(dirpath=tmp_path, save_last=True)  # noqa: E731
    fit(tmp_path, [5, 6, 7], EarlyStopping("val_loss", patience=1), checkpoints())
    trainer = fit(tmp_path, [5, 6, 7], EarlyStopping("val_loss", patience=1), checkpoints(), ckpt_path="last")
    assert trainer.current_epoch == 2 and trainer.should_stop


class OtherRankVotesStop(SingleDeviceStrategy):
    """One process standing in for a job where another rank's metric says stop."""

    def __init__(self) -> None:
        super().__init__()
        self.votes: list[tuple[bool, bool]] = []

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        self.votes.append((decision, all))
        return True if not all else decision


def test_any_rank_asking_to_stop_stops_every_rank(tmp_path: Path) -> None:
    strategy = OtherRankVotesStop()
    trainer = fit(tmp_path, [5, 4, 3, 2], EarlyStopping("val_loss"), strategy=strategy, enable_checkpointing=False)
    assert strategy.votes == [(False, False)]  # this rank's metric improved, but the decision is collective
    assert trainer.current_epoch == 1


def test_a_monitor_that_is_not_logged(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no metric 'val_acc' among the logged ones"):
        fit(tmp_path, [1], EarlyStopping("val_acc"), enable_checkpointing=False)
    with pytest.raises(RuntimeError, match="conditioned on metric `val_acc` which is not available"):  # Lightning's
        fit(tmp_path, [1], EarlyStopping("val_acc"), enable_checkpointing=False)
    with pytest.warns(RuntimeWarning, match="this check is skipped"):  # strict=False: said only when verbose
        trainer = fit(tmp_path, [1], EarlyStopping("val_acc", strict=False, verbose=True), enable_checkpointing=False,
                      max_epochs=2)  # fmt: skip
    assert trainer.current_epoch == 2
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*this check is skipped")
        fit(tmp_path, [1], EarlyStopping("val_acc", strict=False), enable_checkpointing=False, max_epochs=1)
