"""A Lightning module's own choices survive the Trainer: each submodule's train/eval mode, stages switched off
with ``= None``, and ``torch.jit.script`` of a module that ran ``fit``."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError
from helpers import Regressor, loader, quiet_trainer


class FrozenBackbone(Regressor):
    """Fine-tuning: the backbone is frozen in eval mode in __init__ (its BatchNorm statistics must not move)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.backbone.eval()
        self.backbone.requires_grad_(False)
        self.modes: list[tuple[str, bool, bool]] = []

    def forward(self, x):
        return self.net(self.backbone(x))

    def training_step(self, batch, batch_idx):
        self.modes.append(("train", self.backbone.training, self.net.training))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.modes.append(("val", self.backbone.training, self.net.training))
        return super().validation_step(batch, batch_idx)


def test_a_submodule_frozen_in_eval_mode_stays_so_through_fit_and_validation():
    model = FrozenBackbone()
    statistics = model.backbone[1].running_mean.clone()
    with pytest.warns(UserWarning, match="eval mode at the start of training"):
        quiet_trainer(max_epochs=2, num_sanity_val_steps=1, limit_val_batches=1).fit(model, loader(n=16), loader(n=8))
    assert {mode for mode in model.modes if mode[0] == "train"} == {("train", False, True)}
    assert {mode for mode in model.modes if mode[0] == "val"} == {("val", False, False)}
    assert torch.equal(model.backbone[1].running_mean, statistics)
    assert model.net.training and not model.backbone.training  # as before fit


def test_validate_and_predict_hand_back_each_submodule_in_its_mode():
    model = FrozenBackbone()
    trainer = quiet_trainer()
    trainer.validate(model, loader(n=8), verbose=False)
    trainer.predict(model, loader(n=8))
    assert model.net.training and not model.backbone.training


def test_a_module_in_train_mode_starts_fit_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet_trainer(max_steps=1, limit_val_batches=0).fit(Regressor(), loader(n=16))


def test_validation_step_none_fits_without_validation():
    calls = []

    class NoValidation(Regressor):
        def val_dataloader(self):
            calls.append("val_dataloader")
            return loader(n=8)

    model = NoValidation()
    model.validation_step = None  # Lightning's idiom to switch the stage off
    model.val_dataloader = None
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model, loader(n=16))
    assert trainer.global_step == 2 and calls == [] and "val_loss" not in trainer.callback_metrics


def test_val_dataloader_none_fits_without_validation():
    model = Regressor()
    model.val_dataloader = None
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model, loader(n=16))
    assert trainer.global_step == 2 and "val_loss" not in trainer.callback_metrics


def test_train_dataloader_none_uses_the_loader_given_to_fit():
    model = Regressor()
    model.train_dataloader = None
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(model, loader(n=16))
    assert trainer.global_step == 2


def test_test_step_none_makes_test_refuse_with_a_clear_error():
    model = Regressor()
    model.test_step = None
    with pytest.raises(ConfigurationError, match="test_step"):
        quiet_trainer().test(model, loader(n=8), verbose=False)


_JIT_SCRIPT = """
import sys, torch
from helpers import Regressor, loader, quiet_trainer
model = Regressor()
x = torch.randn(3, 4)
model.to_torchscript()  # before fit: no Trainer attached
quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, loader(n=16))
scripted = torch.jit.script(model)
assert torch.allclose(scripted(x), model(x))
model.to_torchscript(sys.argv[1])
assert torch.allclose(torch.jit.load(sys.argv[1])(x), model(x))
"""


def test_torch_jit_script_works_after_fit_and_to_torchscript_before(tmp_path):
    """In a fresh process: once any test has used torch.compile, dynamo's patched ``nn.Module.__init__`` stays in
    the pytest process and TorchScript then fails on every module's ``super().__init__()``, ours or not."""
    import sys
    from pathlib import Path

    from launching import run
    from test_ddp_processes import clean_env

    run([sys.executable, "-c", _JIT_SCRIPT, str(tmp_path / "model.pt")], timeout=120, env=clean_env(),
        cwd=Path(__file__).parent)  # fmt: skip


def test_to_torchscript_keeps_each_submodule_mode():
    model = FrozenBackbone()
    model.to_torchscript()
    assert model.net.training and not model.backbone.training


def test_the_strategy_wrapper_is_in_eval_mode_during_validation_and_back_in_train_mode_after(monkeypatch):
    """As in Lightning, validation switches ``trainer.model`` (here DDP's wrapper), not only the module."""
    from trainer import Callback

    # One rank as torchrun starts it: DDP wraps the module in this process.
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531"}.items():
        monkeypatch.setenv(name, value)

    seen: list[tuple[str, str, bool]] = []

    class WatchMode(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(("train", type(trainer.model).__name__, trainer.model.training))

        def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
            seen.append(("val", type(trainer.model).__name__, trainer.model.training))

    trainer = quiet_trainer(strategy="ddp", devices=1, accelerator="cpu", max_steps=2, val_check_interval=1,
                            limit_val_batches=1, num_sanity_val_steps=0, callbacks=[WatchMode()])
    trainer.fit(Regressor(), loader(n=16), loader(n=8))
    assert seen == [("train", "DistributedDataParallel", True), ("val", "DistributedDataParallel", False)] * 2
