"""The order of every hook in a fit with validation and accumulation, and hook dispatch rules."""
from __future__ import annotations

import torch

from trainer.callbacks import Callback
from helpers import Regressor, loader, quiet_trainer

MODULE_HOOKS = [
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_train_epoch_start",
    "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_validation_start", "on_validation_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end",
    "configure_optimizers", "training_step", "validation_step",
]  # fmt: skip


class Recording(Regressor):
    """Records every hook it receives into a shared list."""

    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls


def _recorder(name):
    def hook(self, *args, **kwargs):  # setup/teardown get stage= as a keyword, as in Lightning
        self.calls.append(name)
        parent = getattr(super(Recording, self), name)
        return parent(*args, **kwargs)

    return hook


for _name in MODULE_HOOKS:
    setattr(Recording, _name, _recorder(_name))


class RecordingCallback(Callback):
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def on_train_epoch_start(self, trainer, module):
        self.calls.append("cb:on_train_epoch_start")

    def on_train_epoch_end(self, trainer, module):
        self.calls.append("cb:on_train_epoch_end")

    def on_validation_end(self, trainer, module):
        self.calls.append("cb:on_validation_end")

    def on_sanity_check_start(self, trainer, module):
        self.calls.append("cb:on_sanity_check_start")

    def on_sanity_check_end(self, trainer, module):
        self.calls.append("cb:on_sanity_check_end")


def _val_block():
    return (["on_validation_start", "on_validation_epoch_start"]
            + ["on_validation_batch_start", "validation_step", "on_validation_batch_end"] * 2
            + ["on_validation_epoch_end", "cb:on_validation_end", "on_validation_end"])  # fmt: skip


def test_hook_order_for_fit_with_validation_and_accumulation():
    calls: list[str] = []
    module = Recording(calls)
    trainer = quiet_trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[RecordingCallback(calls)],
                            num_sanity_val_steps=1)  # fmt: skip
    trainer.fit(module, loader(n=32, batch_size=8), loader(n=16, batch_size=8))

    # Lightning's order: gradients are cleared after the window's first training_step, before its backward.
    first = ["on_train_batch_start", "training_step", "on_before_zero_grad", "on_before_backward", "on_after_backward"]
    last = ["on_train_batch_start", "training_step", "on_before_backward", "on_after_backward", "on_before_optimizer_step"]
    sanity = (["cb:on_sanity_check_start", "on_validation_start", "on_validation_epoch_start",
               "on_validation_batch_start", "validation_step", "on_validation_batch_end",
               "on_validation_epoch_end", "cb:on_validation_end", "on_validation_end", "cb:on_sanity_check_end"])  # fmt: skip
    expected = (
        ["setup", "configure_optimizers", "on_fit_start"] + sanity
        + ["on_train_start", "cb:on_train_epoch_start", "on_train_epoch_start"]
        + (first + ["on_train_batch_end"] + last + ["on_train_batch_end"]) * 2
        + _val_block()
        + ["cb:on_train_epoch_end", "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown"]
    )  # fmt: skip
    assert calls == expected


def test_partial_accumulation_window_steps_at_epoch_end():
    calls: list[str] = []
    module = Recording(calls)
    trainer = quiet_trainer(max_epochs=2, accumulate_grad_batches=4, limit_val_batches=0)
    trainer.fit(module, loader(n=48, batch_size=8))  # 6 batches: a window of 4 and a tail of 2
    assert calls.count("on_before_optimizer_step") == 4
    assert trainer.global_step == 4


def test_returning_minus_one_from_on_train_batch_start_ends_the_epoch():
    class StopsEarly(Regressor):
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if batch_idx == 2 else None

    trainer = quiet_trainer(max_epochs=2, limit_val_batches=0)
    trainer.fit(StopsEarly(), loader(n=64, batch_size=8))
    assert trainer.global_step == 4  # two batches in each of two epochs


def test_only_overridden_callback_hooks_are_called():
    called = []

    class OnlyBatchEnd(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            called.append(batch_idx)

    trainer = quiet_trainer(max_epochs=1, callbacks=[OnlyBatchEnd()])
    trainer.fit(Regressor(), loader(n=24, batch_size=8))
    assert called == [0, 1, 2]
    dispatch = trainer._hooks.callback_hooks
    assert dispatch["on_train_batch_end"] and not dispatch["on_train_batch_start"]


def test_outputs_of_training_step_reach_on_train_batch_end():
    seen = []

    class ReturnsDict(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return {"loss": loss, "extra": batch_idx * 10}

        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append(outputs["extra"])
            assert isinstance(outputs["loss"], torch.Tensor)

    quiet_trainer(max_epochs=1).fit(ReturnsDict(), loader(n=16, batch_size=8))
    assert seen == [0, 10]


def test_a_returned_loss_reaches_on_train_batch_end_as_a_detached_dict():
    """As in Lightning, callbacks read ``outputs["loss"]``; it holds no graph, so storing it keeps nothing alive."""
    returned, seen = [], []

    class Records(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            returned.append(loss.detach().clone())
            return loss

    class Reader(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(outputs["loss"])

    trainer = quiet_trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[Reader()])
    trainer.fit(Records(), loader(n=24, batch_size=8))
    assert len(seen) == 3 and all(value.grad_fn is None and not value.requires_grad for value in seen)
    assert all(torch.equal(a, b) for a, b in zip(seen, returned))  # the step's loss, not divided by accumulation
