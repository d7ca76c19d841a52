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
    weights_at_start: list = []
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0,
                            callbacks=[EndCallback(calls)])  # fmt: skip
    trainer.fit(EndRecorder(calls), loader(n=8), loader(n=8))
    for name in END_HOOKS:
        assert [who for hook, who in calls if hook == name] == ["callback", "module"], name


def test_on_train_epoch_end_runs_monitoring_callbacks_after_the_module(tmp_path):
    """As in Lightning: other callbacks, the module, then checkpointing and early stopping, so these see what the
    module logged in its on_train_epoch_end."""
    calls: list = []
    weights_at_start: list = []

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


def test_resuming_restores_module_and_callbacks_before_configure_optimizers(tmp_path):
    """Lightning's resume order: the module's on_load_checkpoint first (it may still edit the checkpoint: here it
    renames a weight key an older version of the module saved), then the callbacks' on_load_checkpoint and
    load_state_dict, then configure_optimizers, on_fit_start, zero_grad; the optimizer state loads after that."""
    import torch

    class AdamRegressor(Regressor):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    first = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    first.fit(AdamRegressor(), loader(n=16))
    path = str(tmp_path / "old.ckpt")
    first.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)
    saved["state_dict"] = {key.replace("net.", "old_net."): value for key, value in saved["state_dict"].items()}
    calls: list = []
    weights_at_start: list = []

    class Stateful(Callback):
        def state_dict(self):
            return {"visits": 0}

        def load_state_dict(self, state_dict):
            calls.append(("Callback.load_state_dict", state_dict["visits"]))

        def on_load_checkpoint(self, trainer, module, checkpoint):
            calls.append(("Callback.on_load_checkpoint", sorted(checkpoint["state_dict"])[0]))

        def on_fit_start(self, trainer, module):
            calls.append(("Callback.on_fit_start", trainer.optimizers[0].state_dict()["state"] == {}))
            weights_at_start.append(module.net[0].weight.detach().clone())

    saved["callbacks"] = {Stateful().state_key: {"visits": 3}}
    torch.save(saved, path)

    class Resumed(AdamRegressor):
        def on_load_checkpoint(self, checkpoint):
            calls.append(("on_load_checkpoint", sorted(checkpoint["state_dict"])[0]))
            checkpoint["state_dict"] = {key.replace("old_net.", "net."): value
                                        for key, value in checkpoint["state_dict"].items()}

        def configure_optimizers(self):
            calls.append(("configure_optimizers",))
            return super().configure_optimizers()

        def zero_grad(self, *args, **kwargs):
            calls.append(("zero_grad",))
            return super().zero_grad(*args, **kwargs)

        def on_train_start(self):
            calls.append(("on_train_start", self.trainer.optimizers[0].state_dict()["state"] != {}))

    model = Resumed()
    quiet_trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, callbacks=[Stateful()]).fit(
        model, loader(n=16), ckpt_path=path)
    assert calls == [
        ("on_load_checkpoint", "old_net.0.bias"),
        ("Callback.on_load_checkpoint", "net.0.bias"),  # after the module edited the checkpoint
        ("Callback.load_state_dict", 3),
        ("configure_optimizers",),
        ("Callback.on_fit_start", True),  # the saved optimizer state is not loaded yet, as in Lightning
        ("zero_grad",),
        ("on_train_start", True),
    ]
    assert torch.equal(weights_at_start[0], saved["state_dict"]["old_net.0.weight"])  # the renamed key loaded
