"""A fit that trains nothing says so: no optimizer step (empty data, a training_step without ``return loss``), a
monitored checkpoint whose metric never came, and a second ``fit()`` on a Trainer that already finished."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.callbacks import ModelCheckpoint
from ckpt_support import TinyRegressor, loaders, make_trainer


class ForgetsToReturn(TinyRegressor):
    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)  # computes the loss, then drops it


def no_step_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "without a single optimizer step" in str(w.message)]


def test_an_empty_training_loader_warns(tmp_path: Path) -> None:
    empty = DataLoader(TensorDataset(torch.randn(0, 6), torch.randn(0, 1)), batch_size=4)
    module = TinyRegressor()
    before = [p.clone() for p in module.parameters()]
    with pytest.warns(UserWarning, match="without a single optimizer step: the training dataloader gave no batches"):
        make_trainer(tmp_path, enable_checkpointing=False).fit(module, empty)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_a_training_step_that_returns_nothing_warns(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"returned None \(no loss\) for all 8 batch\(es\): did it forget `return loss`"):
        make_trainer(tmp_path, enable_checkpointing=False).fit(ForgetsToReturn(), loaders()[0])


def test_asking_for_no_training_batches_is_quiet(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make_trainer(tmp_path, enable_checkpointing=False, limit_train_batches=0).fit(TinyRegressor(), *loaders())
        make_trainer(tmp_path, enable_checkpointing=False).fit(TinyRegressor(), *loaders())  # a fit that steps
    assert no_step_warnings(record) == []


def test_a_monitored_metric_that_never_came_warns_at_the_end(tmp_path: Path) -> None:
    empty_val = DataLoader(TensorDataset(torch.randn(0, 6), torch.randn(0, 1)), batch_size=4)
    callback = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val_loss")
    with pytest.warns(UserWarning, match=r"monitor='val_loss'\): the metric was never logged during this fit, so no "
                                         r"checkpoint was saved for it.*No validation batch ran"):
        make_trainer(tmp_path, callbacks=[callback]).fit(TinyRegressor(), loaders()[0], empty_val)
    assert callback.best_model_path == "" and not list((tmp_path / "ckpts").glob("*.ckpt"))


def test_a_second_fit_on_a_finished_trainer_says_it_trains_nothing(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, enable_checkpointing=False, max_epochs=2)
    module = TinyRegressor()
    trainer.fit(module, *loaders())
    weights = [p.clone() for p in module.parameters()]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(module, *loaders())
    messages = [str(w.message) for w in record]
    assert any("already trained to epoch 2, global step 8 (max_epochs=2, max_steps=-1), so this fit() continues "
               "from there and trains nothing" in m for m in messages), messages
    assert no_step_warnings(record) == []  # one warning, the one that says why
    assert trainer.global_step == 8 and all(torch.equal(a, b) for a, b in zip(weights, module.parameters()))
