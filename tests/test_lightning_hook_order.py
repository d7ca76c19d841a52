"""The order between callbacks and the module on every hook, the hooks' arguments, and stopping mid-epoch, as a
Lightning project observes them."""
from __future__ import annotations

import os

from trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint
from helpers import Regressor, loader, quiet_trainer

#: Every ``*_end`` hook (and teardown) a callback and the module both implement: Lightning calls the callbacks first.
END_HOOKS = [
    "on_train_batch_end", "on_train_epoch_end", "on_validation_batch_end", "on_validation_epoch_end",
    "on_validation_end", "on_train_end", "on_fit_end", "teardown",
]  # fmt: skip


class EndRecorder(Regressor):
    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls


class EndCallback(Callback):
    def __init__(self, calls: list, tag: str = "callback") -> None:
        self.calls, self.tag = calls, tag


def _module_hook(name):
    def hook(self, *args, **kwargs):
        self.calls.append((name, "module"))

    return hook


def _callback_hook(name):
    def hook(self, trainer, module, *args, **kwargs):
        self.calls.append((name, self.tag))

    return hook


for _name in END_HOOKS:
    setattr(EndRecorder, _name, _module_hook(_name))
    setattr(EndCallback, _name, _callback_hook(_name))


def test_callbacks_run_before_the_module_on_every_end_hook():
    calls: list = []
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0,
                            callbacks=[EndCallback(calls)])  # fmt: skip
    trainer.fit(EndRecorder(calls), loader(n=8), loader(n=8))
    for name in END_HOOKS:
        assert [who for hook, who in calls if hook == name] == ["callback", "module"], name


def test_on_train_epoch_end_runs_monitoring_callbacks_after_the_module(tmp_path):
    """As in Lightning: other callbacks, the module, then checkpointing and early stopping, so these see what the
    module logged in its on_train_epoch_end."""
    calls: list = []

    class LogsAtEpochEnd(EndRecorder):
        def on_train_epoch_end(self):
            calls.append(("on_train_epoch_end", "module"))
            self.log("epoch_metric", float(self.current_epoch))

    class Checkpoint(ModelCheckpoint):
        def on_train_epoch_end(self, trainer, module):
            calls.append(("on_train_epoch_end", "checkpoint"))
            super().on_train_epoch_end(trainer, module)

    class Stopping(EarlyStopping):
        def on_train_epoch_end(self, trainer, module):
            calls.append(("on_train_epoch_end", "early_stopping"))
            super().on_train_epoch_end(trainer, module)

    callbacks = [Checkpoint(dirpath=tmp_path, monitor="epoch_metric", filename="{epoch_metric}"),
                 Stopping(monitor="epoch_metric", check_on_train_epoch_end=True, patience=5), EndCallback(calls)]
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, callbacks=callbacks, enable_checkpointing=True)
    trainer.fit(LogsAtEpochEnd(calls), loader(n=8))
    # (checkpointing callbacks run last among callbacks, as in Lightning)
    assert [who for hook, who in calls if hook == "on_train_epoch_end"] == [
        "callback", "module", "early_stopping", "checkpoint"]
    assert os.listdir(tmp_path) == ["epoch_metric=0.0.ckpt"]


def test_setup_and_teardown_get_the_stage_as_a_keyword():
    seen = []

    class KeywordHooks(Regressor):
        def setup(self, *args, **kwargs):
            seen.append(("module.setup", args, kwargs))

        def teardown(self, *args, **kwargs):
            seen.append(("module.teardown", args, kwargs))

    class KeywordCallback(Callback):
        def setup(self, trainer, module, *args, **kwargs):
            seen.append(("callback.setup", args, kwargs))

        def teardown(self, trainer, module, *args, **kwargs):
            seen.append(("callback.teardown", args, kwargs))

    quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[KeywordCallback()]).fit(KeywordHooks(), loader(n=8))
    assert seen == [("callback.setup", (), {"stage": "fit"}), ("module.setup", (), {"stage": "fit"}),
                    ("callback.teardown", (), {"stage": "fit"}), ("module.teardown", (), {"stage": "fit"})]


def test_should_stop_mid_epoch_still_runs_that_epochs_validation():
    validated_at = []

    class StopsAtBatchFour(Regressor):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx == 4:
                self.trainer.should_stop = True

        def on_validation_end(self):
            if not self.trainer.sanity_checking:
                validated_at.append(self.global_step)

    trainer = quiet_trainer(max_epochs=3, limit_val_batches=1)
    trainer.fit(StopsAtBatchFour(), loader(n=80), loader(n=8))  # 10 batches an epoch
    assert validated_at == [5] and trainer.global_step == 5


def test_max_steps_mid_epoch_writes_the_monitored_top_k_checkpoint_and_last(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="train_loss", save_last=True, filename="best")
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(Regressor(), loader(n=80))
    assert sorted(os.listdir(tmp_path)) == ["best.ckpt", "last.ckpt"]
    assert checkpoint.best_model_path == str(tmp_path / "best.ckpt")
