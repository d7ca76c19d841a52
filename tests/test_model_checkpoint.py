"""ModelCheckpoint: which files exist after a fit, what they are called, and what survives a resume."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from trainer.callbacks import ModelCheckpoint
from ckpt_support import TinyRegressor, loaders, make_trainer
from trainer.strategies.errors import ConfigurationError


def files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


def fit(root: Path, callback: ModelCheckpoint, scores=None, ckpt_path=None, **kwargs) -> "object":
    train, val = loaders()  # 4 batches per epoch
    settings = dict(max_epochs=5, callbacks=[callback])
    settings.update(kwargs)
    trainer = make_trainer(root, **settings)
    trainer.fit(TinyRegressor(val_scores=scores), train, val, ckpt_path=ckpt_path)
    return trainer


SCORES = [5.0, 3.0, 4.0, 1.0, 2.0]  # val_loss of epochs 0..4


@pytest.mark.parametrize("mode, kept, best", [("min", ["epoch=3", "epoch=4"], "epoch=3"),
                                              ("max", ["epoch=0", "epoch=2"], "epoch=0")])  # fmt: skip
def test_top_k_keeps_the_best_files_by_the_monitored_metric(tmp_path: Path, mode: str, kept: list[str],
                                                            best: str) -> None:  # fmt: skip
    callback = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", mode=mode, save_top_k=2, filename="{epoch}")
    fit(tmp_path, callback, SCORES)
    assert files(tmp_path / "ck") == [f"{name}.ckpt" for name in kept]
    assert Path(callback.best_model_path).name == f"{best}.ckpt"
    assert callback.best_model_score.item() == (1.0 if mode == "min" else 5.0)
    assert sorted(Path(p).name for p in callback.best_k_models) == [f"{name}.ckpt" for name in kept]
    assert callback.kth_value.item() == (2.0 if mode == "min" else 4.0)
    saved = torch.load(callback.best_model_path, weights_only=True)
    assert saved["epoch"] == int(best[-1])


def test_save_top_k_all_none_and_last(tmp_path: Path) -> None:
    everything = ModelCheckpoint(dirpath=tmp_path / "all", monitor="val_loss", save_top_k=-1, filename="{epoch}")
    fit(tmp_path / "a", everything, SCORES)
    assert files(tmp_path / "all") == [f"epoch={i}.ckpt" for i in range(5)]
    only_last = ModelCheckpoint(dirpath=tmp_path / "last", monitor="val_loss", save_top_k=0, save_last=True)
    fit(tmp_path / "b", only_last, SCORES)
    assert files(tmp_path / "last") == ["last.ckpt"]
    assert torch.load(only_last.last_model_path, weights_only=True)["global_step"] == 20


def test_filename_templates_with_metrics(tmp_path: Path) -> None:
    named = ModelCheckpoint(dirpath=tmp_path / "named", monitor="val_loss", save_top_k=-1,
                            filename="{epoch}-{val_loss:.3f}")  # fmt: skip
    fit(tmp_path / "a", named, SCORES, max_epochs=2)
    assert files(tmp_path / "named") == ["epoch=0-val_loss=5.000.ckpt", "epoch=1-val_loss=3.000.ckpt"]
    bare = ModelCheckpoint(dirpath=tmp_path / "bare", monitor="val_loss", save_top_k=-1,
                           filename="run-{epoch:02d}-{step}-{val_loss:.1f}", auto_insert_metric_name=False)  # fmt: skip
    fit(tmp_path / "b", bare, SCORES, max_epochs=2)
    assert files(tmp_path / "bare") == ["run-00-4-5.0.ckpt", "run-01-8-3.0.ckpt"]


def test_every_n_train_steps_saves_on_its_schedule_only(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=3, save_top_k=-1)
    fit(tmp_path, callback, max_epochs=2)  # 8 steps: no save of the final state outside the schedule (as Lightning)
    assert files(tmp_path / "ck") == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"]


def test_every_n_epochs(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_epochs=2, save_top_k=-1, filename="{epoch}")
    fit(tmp_path, callback, max_epochs=5)
    assert files(tmp_path / "ck") == ["epoch=1.ckpt", "epoch=3.ckpt"]  # as Lightning: no final save off the schedule


def test_train_time_interval(tmp_path: Path) -> None:
    never = ModelCheckpoint(dirpath=tmp_path / "never", train_time_interval=timedelta(hours=1), save_top_k=-1)
    fit(tmp_path / "a", never, max_epochs=2)
    assert files(tmp_path / "never") == []  # the interval never passed (as Lightning: no final save)
    often = ModelCheckpoint(dirpath=tmp_path / "often", train_time_interval=1e-9, save_top_k=-1)
    fit(tmp_path / "b", often, max_epochs=2)
    assert len(files(tmp_path / "often")) == 8  # the interval has passed at every step


def test_weights_only_files(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path / "ck", save_weights_only=True, save_last=True)
    fit(tmp_path, callback, max_epochs=1)
    for name in files(tmp_path / "ck"):
        checkpoint = torch.load(tmp_path / "ck" / name, weights_only=True)
        assert "state_dict" in checkpoint and "optimizer_states" not in checkpoint, name


def test_last_is_a_link_to_the_newest_checkpoint(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)
    fit(tmp_path, callback, max_epochs=2)
    assert files(tmp_path / "ck") == ["epoch=1-step=8.ckpt", "last.ckpt"]
    assert os.path.samefile(callback.last_model_path, callback.best_model_path)


def test_top_k_bookkeeping_survives_a_resume(tmp_path: Path) -> None:
    def callback() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=2, save_last=True,
                               filename="{epoch}")  # fmt: skip

    scores = [5.0, 3.0, 4.0, 4.5, 2.0]
    fit(tmp_path, callback(), scores, max_epochs=3)
    assert files(tmp_path / "ck") == ["epoch=1.ckpt", "epoch=2.ckpt", "last.ckpt"]
    resumed = callback()
    fit(tmp_path, resumed, scores, max_epochs=5, ckpt_path="last")
    # 4.5 is worse than both kept scores, so it is not saved; 2.0 replaces 4.0. A callback that forgot its
    # state would have saved epoch 3.
    assert files(tmp_path / "ck") == ["epoch=1.ckpt", "epoch=4.ckpt", "last.ckpt"]
    assert Path(resumed.best_model_path).name == "epoch=4.ckpt" and resumed.best_model_score.item() == 2.0


def test_best_checkpoint_for_validate_test_and_fit(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", filename="{epoch}")
    trainer = fit(tmp_path, callback, [3.0, 1.0, 2.0], max_epochs=3)
    module = trainer.module
    train, val = loaders()
    trainer.validate(module, val, ckpt_path="best", verbose=False)
    assert trainer.ckpt_path == callback.best_model_path and Path(callback.best_model_path).name == "epoch=1.ckpt"
    best = torch.load(callback.best_model_path, weights_only=True)["state_dict"]
    assert all(torch.equal(best[k], v) for k, v in module.state_dict().items())
    TinyRegressor.test_step = TinyRegressor.validation_step
    try:
        trainer.test(module, val, ckpt_path="best", verbose=False)
    finally:
        del TinyRegressor.test_step
    assert trainer.ckpt_path == callback.best_model_path
    trainer.fit(module, train, val, ckpt_path="best")  # resumes at the end of epoch 1 and trains epoch 2 again
    assert trainer.global_step == 12


def test_default_callback_folder_and_fast_dev_run(tmp_path: Path) -> None:
    trainer = fit(tmp_path / "a", None, max_epochs=2, callbacks=None)
    assert isinstance(trainer.checkpoint_callback, ModelCheckpoint)
    assert files(tmp_path / "a" / "checkpoints") == ["epoch=1-step=8.ckpt"]
    fit(tmp_path / "b", None, callbacks=None, fast_dev_run=True)
    assert not (tmp_path / "b" / "checkpoints").exists()
    trainer = fit(tmp_path / "c", None, max_epochs=1, callbacks=None, enable_checkpointing=False)
    assert trainer.checkpoint_callback is None and not (tmp_path / "c" / "checkpoints").exists()


def test_existing_files_get_a_version_suffix(tmp_path: Path) -> None:
    for _ in range(2):
        fit(tmp_path, ModelCheckpoint(dirpath=tmp_path / "ck"), max_epochs=1)
    assert files(tmp_path / "ck") == ["epoch=0-step=4-v1.ckpt", "epoch=0-step=4.ckpt"]


def test_a_monitor_that_is_never_logged_is_an_error_naming_what_is(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no metric 'val_acc' among the logged ones .*'val_loss'"):
        fit(tmp_path, ModelCheckpoint(dirpath=tmp_path, monitor="val_acc"), max_epochs=1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(every_n_train_steps=2, every_n_epochs=1), "mutually exclusive"),
    (dict(save_top_k=3), "without a monitored metric"),
    (dict(mode="best"), "mode='best'"),
    (dict(save_top_k=-2), "save_top_k=-2"),
    (dict(save_last="copy"), "save_last='copy'"),
])  # fmt: skip
def test_invalid_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ModelCheckpoint(**kwargs)
