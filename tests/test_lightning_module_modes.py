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


def test_torch_jit_script_works_after_fit_and_to_torchscript_before(tmp_path):
    model = Regressor()
    x = torch.randn(3, 4)
    model.to_torchscript()  # before fit: no Trainer attached
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, loader(n=16))
    scripted = torch.jit.script(model)
    assert torch.allclose(scripted(x), model(x))
    model.to_torchscript(tmp_path / "model.pt")
    assert torch.allclose(torch.jit.load(str(tmp_path / "model.pt"))(x), model(x))


def test_to_torchscript_keeps_each_submodule_mode():
    model = FrozenBackbone()
    model.to_torchscript()
    assert model.net.training and not model.backbone.training
