"""What a ported project's callbacks and checkpoints refuse or say, with the exception type Lightning uses and a
message that still holds Lightning's key phrase (a ported ``pytest.raises(..., match=...)`` keeps matching)."""
from __future__ import annotations

import pytest
import torch

from ckpt_support import TinyRegressor, loaders, make_trainer
from trainer.callbacks import EarlyStopping, ModelCheckpoint
from trainer.utilities.exceptions import MisconfigurationException


class ScriptedLoss(TinyRegressor):
    """Logs ``val_loss`` from a script, one value per epoch."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.tensor(self.scores[min(self.current_epoch, len(self.scores) - 1)]))


def test_early_stopping_mode_is_refused_in_lightnings_words():
    with pytest.raises(MisconfigurationException, match="`mode` can be .* got sideways"):
        EarlyStopping(monitor="val_loss", mode="sideways")


def test_early_stopping_on_a_metric_nobody_logs_is_a_runtime_error(tmp_path):
    trainer = make_trainer(tmp_path, max_epochs=1, callbacks=[EarlyStopping(monitor="val_acc")],
                           enable_checkpointing=False)  # fmt: skip
    with pytest.raises(RuntimeError, match="Early stopping conditioned on metric `val_acc` which is not available"):
        trainer.fit(TinyRegressor(), *loaders())


@pytest.mark.parametrize(("scores", "kwargs", "phrase"), [
    ([0.5, 0.05], dict(stopping_threshold=0.1), "Stopping threshold reached"),
    ([0.5, 9.0], dict(divergence_threshold=5.0), "Divergence threshold reached"),
])  # fmt: skip
def test_early_stopping_threshold_reasons_start_as_lightnings(tmp_path, scores, kwargs, phrase):
    stopper = EarlyStopping(monitor="val_loss", patience=10, **kwargs)
    trainer = make_trainer(tmp_path, max_epochs=5, callbacks=[stopper], enable_checkpointing=False)
    trainer.fit(ScriptedLoss(scores), *loaders())
    assert trainer.current_epoch == 2
    assert stopper.stopping_reason_message.startswith(phrase)


def test_resuming_a_checkpoint_past_max_epochs_is_refused(tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)
    make_trainer(tmp_path, max_epochs=3, callbacks=[saver]).fit(TinyRegressor(), *loaders())
    again = make_trainer(tmp_path, max_epochs=1)
    with pytest.raises(MisconfigurationException, match=r"You restored a checkpoint with current_epoch=3, but you "
                                                        r"have set Trainer\(max_epochs=1\)"):  # fmt: skip
        again.fit(TinyRegressor(), *loaders(), ckpt_path=saver.last_model_path)
    equal = make_trainer(tmp_path, max_epochs=3)  # at max_epochs: nothing left to train, not an error
    equal.fit(TinyRegressor(), *loaders(), ckpt_path=saver.last_model_path)
    assert equal.current_epoch == 3


@pytest.mark.parametrize(("kwargs", "phrase"), [
    (dict(mode="sideways"), "`mode` can be .* but got sideways"),
    (dict(save_top_k=-3), "Must be >= -1"),
    (dict(save_top_k=3), r"ModelCheckpoint\(save_top_k=3, monitor=None\) is not a valid"),
    (dict(every_n_epochs=-1), "Must be >= 0"),
    (dict(every_n_train_steps=-1), "Must be >= 0"),
    (dict(every_n_train_steps=2, every_n_epochs=3), "Combination of parameters every_n_train_steps"),
])  # fmt: skip
def test_model_checkpoint_refusals_keep_lightnings_phrases(tmp_path, kwargs, phrase):
    with pytest.raises(MisconfigurationException, match=phrase):
        ModelCheckpoint(dirpath=tmp_path, **kwargs)


def test_checkpoint_scores_keep_the_logged_dtype_and_are_saved_as_tensors(tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val_loss", save_top_k=3, filename="{epoch}")
    make_trainer(tmp_path, max_epochs=3, callbacks=[saver]).fit(ScriptedLoss([0.3, 0.2, 0.1]), *loaders())
    assert saver.current_score.dtype == torch.float32 and saver.current_score == 0.1  # as logged, not widened
    assert saver.best_model_score == 0.1
    saved = torch.load(saver.best_model_path, weights_only=True)["callbacks"]
    state = next(value for key, value in saved.items() if key.startswith("ModelCheckpoint"))
    assert isinstance(state["current_score"], torch.Tensor) and state["current_score"] == 0.1
    assert sorted(float(score) for score in state["best_k_models"].values()) == pytest.approx([0.1, 0.2, 0.3])


def test_tuner_and_monitor_refusals_keep_lightnings_phrases(tmp_path):
    from trainer.callbacks import BatchSizeFinder, LearningRateMonitor
    from trainer.tuner import Tuner

    with pytest.raises(MisconfigurationException, match="should be either of"):
        BatchSizeFinder(mode="triple")
    tuner = Tuner(make_trainer(tmp_path, max_epochs=1))
    train, val = loaders()
    with pytest.raises(MisconfigurationException, match="method .* is invalid"):
        tuner.scale_batch_size(TinyRegressor(), train, method="prediction")
    with pytest.raises(MisconfigurationException, match="please consider setting `train_dataloaders` and"):
        tuner.scale_batch_size(TinyRegressor(), dataloaders=val)
    with pytest.raises(MisconfigurationException, match="please consider setting `dataloaders` instead"):
        tuner.scale_batch_size(TinyRegressor(), train_dataloaders=train, method="validate")
    with pytest.raises(MisconfigurationException, match="should have one of these fields"):
        tuner.lr_find(TinyRegressor(lr=0.1), train, attr_name="missing_rate")
    quiet = make_trainer(tmp_path, max_epochs=1, callbacks=[LearningRateMonitor()])
    with pytest.raises(MisconfigurationException, match="`Trainer` that has no logger"):
        quiet.fit(TinyRegressor(), train, val)


def test_a_model_checkpoint_with_checkpointing_turned_off_is_refused(tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss")
    with pytest.raises(MisconfigurationException, match="`enable_checkpointing=False` but found `ModelCheckpoint`"):
        make_trainer(tmp_path, callbacks=[saver], enable_checkpointing=False)
    with pytest.raises(MisconfigurationException, match="found `ModelCheckpoint`"):  # barebones turns it off too
        make_trainer(tmp_path, callbacks=[saver], barebones=True, enable_progress_bar=None, enable_model_summary=None,
                     logger=None)  # fmt: skip
    off = make_trainer(tmp_path, callbacks=[], enable_checkpointing=False)
    assert off.checkpoint_callback is None
    kept = make_trainer(tmp_path, callbacks=[saver])  # enable_checkpointing=True keeps the user's, adds none
    assert kept.checkpoint_callbacks == [saver]


def test_save_last_link_on_a_url_is_refused_at_setup_called_with_lightnings_keywords(tmp_path):
    saver = ModelCheckpoint(dirpath="memory://no-links-here", save_last="link")
    with pytest.raises(ValueError, match="save_last='link'.* is only supported for local file paths"):
        saver.setup(trainer=make_trainer(tmp_path), pl_module=TinyRegressor(), stage="fit")
    local = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last="link")
    local.setup(trainer=make_trainer(tmp_path), pl_module=TinyRegressor(), stage="fit")
    assert local.dirpath == str(tmp_path / "ckpts")
