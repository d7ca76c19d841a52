"""What Lightning refuses or warns about, refused or warned about here too (our wording, the same exception type:
``MisconfigurationException`` is ``ConfigurationError``)."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.loggers import CSVLogger
from trainer.utilities.exceptions import MisconfigurationException


def data(n: int = 16) -> DataLoader:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class LitModel(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def quiet(**kwargs) -> Trainer:
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)


def test_limit_batches_of_one_says_it_means_one_batch(caplog):
    with caplog.at_level(logging.INFO):
        quiet(limit_train_batches=1, limit_val_batches=1, val_check_interval=1)
    assert "`Trainer(limit_train_batches=1)` was configured so 1 batch per epoch will be used." in caplog.text
    assert "`Trainer(limit_val_batches=1)` was configured so 1 batch will be used." in caplog.text
    assert "`Trainer(val_check_interval=1)` was configured so validation will run after every batch." in caplog.text


def test_a_fractional_val_check_interval_needs_epochs():
    with pytest.raises(MisconfigurationException, match="check_val_every_n_epoch=None"):
        quiet(val_check_interval=0.5, check_val_every_n_epoch=None)
    quiet(val_check_interval=10, check_val_every_n_epoch=None)  # an int counts batches across epochs: fine


def test_clip_gradients_arguments_that_contradict_the_trainer_are_refused():
    class Clips(LitModel):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm="value")

    with pytest.raises(MisconfigurationException, match=r"contradicts Trainer\(gradient_clip_val=0.5\)"):
        quiet(max_steps=1, gradient_clip_val=0.5).fit(Clips(), data())
    quiet(max_steps=1).fit(Clips(), data())  # nothing set on the Trainer: the module decides

    class SameValue(LitModel):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="value")

    with pytest.raises(MisconfigurationException, match="gradient_clip_algorithm='value'"):
        quiet(max_steps=1, gradient_clip_val=0.5, gradient_clip_algorithm="norm").fit(SameValue(), data())
    # As in Lightning, an algorithm not set on the Trainer (None) is the module's choice.
    trainer = quiet(max_steps=1, gradient_clip_val=0.5)
    trainer.fit(SameValue(), data())
    assert trainer.gradient_clip_algorithm is None


def test_clip_gradients_without_arguments_uses_the_trainers_settings():
    class ClipsInManual(LitModel):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.largest_gradient = []

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            x, y = batch
            self.manual_backward(1e3 * F.mse_loss(self.layer(x), y))
            self.clip_gradients(opt)  # Trainer(gradient_clip_val=1e-3, gradient_clip_algorithm="value")
            self.largest_gradient.append(max(p.grad.abs().max().item() for p in self.parameters()))
            opt.step()

    model = ClipsInManual()
    quiet(max_steps=2, gradient_clip_val=1e-3, gradient_clip_algorithm="value").fit(model, data())
    assert model.largest_gradient == pytest.approx([1e-3, 1e-3])


def test_extra_scheduler_keys_and_onecycle_per_epoch_warn():
    class Extra(LitModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "intervall": "step"}}

    with pytest.warns(RuntimeWarning, match=r"Found unsupported keys in the lr scheduler dict: \{'intervall'\}"):
        quiet(max_steps=1).fit(Extra(), data())

    class OneCycle(LitModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}

    with pytest.warns(RuntimeWarning, match="Are you sure you didn't mean 'interval': 'step'"):
        quiet(max_steps=1).fit(OneCycle(), data())


def test_a_module_left_in_eval_mode_and_a_logging_interval_longer_than_the_epoch_warn(tmp_path):
    model = LitModel()
    model.layer.eval()
    with pytest.warns(UserWarning, match=r"1 module\(s\) are in eval mode at the start of training"):
        quiet(max_steps=1).fit(model, data())
    with pytest.warns(UserWarning, match=r"The number of training batches \(4\) is smaller than the logging interval "
                                         r"Trainer\(log_every_n_steps=50\)"):
        quiet(max_steps=1, logger=CSVLogger(tmp_path)).fit(LitModel(), data())
