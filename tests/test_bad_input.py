"""Every misuse gets an error that names the argument and says what would be valid."""
from __future__ import annotations

import pytest
import torch

from helpers import Regressor, loader, quiet_trainer
from trainer import ConfigurationError, Trainer


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"accelerator": "tpu"}, r"accelerator='tpu'.*'cpu'.*'gpu'.*'mps'"),
        ({"strategy": "horovod"}, r"strategy='horovod' is not known.*'single_device'"),
        ({"strategy": 3}, r"strategy=3 must be a strategy name"),
        ({"precision": "17"}, r"precision='17'.*'32-true'.*'64-true'.*'16-mixed'.*'bf16-mixed'.*'bf16'.*'16-true'.*'bf16-true'"),
        ({"precision": 8}, r"precision=8 is not supported"),
        ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches=0 must be an int >= 1"),
        ({"accumulate_grad_batches": 2.5}, r"accumulate_grad_batches=2.5"),
        ({"max_epochs": -2}, r"max_epochs=-2"),
        ({"max_epochs": "ten"}, r"max_epochs='ten'"),
        ({"max_steps": -5}, r"max_steps=-5"),
        ({"min_epochs": 5, "max_epochs": 2}, r"min_epochs=5 is larger than max_epochs=2"),
        ({"limit_train_batches": 1.5}, r"limit_train_batches=1.5 is a fraction outside"),
        ({"limit_val_batches": -1}, r"limit_val_batches=-1 must be >= 0"),
        ({"val_check_interval": 0}, r"val_check_interval=0"),
        ({"check_val_every_n_epoch": 0}, r"check_val_every_n_epoch=0"),
        ({"gradient_clip_val": -1.0}, r"gradient_clip_val=-1.0"),
        ({"gradient_clip_algorithm": "l2"}, r"gradient_clip_algorithm='l2'.*'norm' or 'value'"),
        ({"log_every_n_steps": 0}, r"log_every_n_steps=0"),
        ({"num_sanity_val_steps": -2}, r"num_sanity_val_steps=-2"),
        ({"callbacks": [object()]}, r"not a trainer\.Callback"),
        ({"logger": "tensorboard"}, r"is not a Logger"),
        ({"devices": 0}, r"devices=0 must be at least 1"),
        ({"devices": "many"}, r"devices='many' is not understood"),
        ({"num_nodes": 0}, r"num_nodes=0 must be a positive integer"),
        ({"deterministic": "yes"}, r"deterministic='yes'"),
        ({"fast_dev_run": -1}, r"fast_dev_run=-1"),
    ],
)
def test_invalid_trainer_arguments(kwargs, pattern):
    with pytest.raises(ConfigurationError, match=pattern):
        Trainer(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA devices")
@pytest.mark.parametrize("kwargs", [{"accelerator": "gpu"}, {"accelerator": "cuda", "devices": 4}])
def test_asking_for_gpus_on_a_machine_without_any_says_what_was_found(kwargs):
    with pytest.raises(ConfigurationError, match=r"device_count\(\) == 0.*accelerator='cpu'"):
        Trainer(**kwargs)


def test_configuration_error_is_a_value_and_type_error():
    with pytest.raises(ValueError):
        Trainer(precision="17")
    with pytest.raises(TypeError):
        Trainer(precision="17")


class ReturnsText(Regressor):
    def training_step(self, batch, batch_idx):
        return "not a loss"


class ReturnsVector(Regressor):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return (self(x) - y) ** 2


class ReturnsDetached(Regressor):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).detach()


@pytest.mark.parametrize(
    "module, pattern",
    [
        (ReturnsText(), r"training_step returned str 'not a loss'.*loss tensor, a dict with a 'loss' key, or None"),
        (ReturnsVector(), r"training_step returned a loss of \(8, 1\); it must be a scalar"),
        (ReturnsDetached(), r"does not require grad"),
    ],
)
def test_training_step_returning_a_non_loss(module, pattern):
    with pytest.raises(ConfigurationError, match=pattern):
        quiet_trainer(max_epochs=1).fit(module, loader())


def _with_optimizers(value):
    class Custom(Regressor):
        def configure_optimizers(self):
            return value(self) if callable(value) else value

    return Custom()


@pytest.mark.parametrize(
    "value, pattern",
    [
        (42, r"Unknown configuration for model optimizers: configure_optimizers returned int 42.*must return one of"),
        ({"lr": 0.1}, r"without a usable 'optimizer'"),
        (lambda m: {"optimizer": torch.optim.SGD(m.parameters(), lr=0.1), "lr_scheduler": "cosine"},
         r"lr scheduler `str` doesn't follow PyTorch's LRScheduler API"),
        (lambda m: {"optimizer": (o := torch.optim.SGD(m.parameters(), lr=0.1)),
                    "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "interval": "batch"}},
         r'The "interval" key in lr scheduler dict must be "step" or "epoch" but is "batch"'),
        (lambda m: {"optimizer": (o := torch.optim.SGD(m.parameters(), lr=0.1)),
                    "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o)},
         r"must include a monitor when a `ReduceLROnPlateau` scheduler is used"),
        (lambda m: [torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.Adam(m.parameters())],
         r"returned 2 optimizers.*only supported with manual optimization.*automatic_optimization = False"),
    ],
)
def test_configure_optimizers_returning_something_unusable(value, pattern):
    with pytest.raises(ConfigurationError, match=pattern):
        quiet_trainer(max_epochs=1).fit(_with_optimizers(value), loader())


def test_plateau_scheduler_monitoring_a_metric_never_logged_lists_what_was_logged():
    def make(m):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer),
                "monitor": "val_acc"}  # fmt: skip

    with pytest.raises(ConfigurationError,
                       match=r"conditioned on metric 'val_acc' which is not available. Available metrics are: \[.*'val_loss'"):
        quiet_trainer(max_epochs=1).fit(_with_optimizers(make), loader(), loader())


def test_fit_without_training_data():
    with pytest.raises(ConfigurationError, match=r"fit\(\) has no training data"):
        quiet_trainer().fit(Regressor())
    with pytest.raises(ConfigurationError, match=r"train_dataloaders must be a torch DataLoader"):
        quiet_trainer().fit(Regressor(), 42)


def test_fit_with_something_that_is_not_a_module():
    with pytest.raises(ConfigurationError, match=r"needs a TrainModule; got Linear"):
        quiet_trainer().fit(torch.nn.Linear(2, 2), loader())


def test_missing_checkpoint_path_is_printed(tmp_path):
    missing = tmp_path / "nope" / "model.ckpt"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        quiet_trainer(max_epochs=1).fit(Regressor(), loader(), ckpt_path=missing)


def test_validate_without_a_model_or_validation_step():
    with pytest.raises(ConfigurationError, match=r"validate\(\) needs a model"):
        quiet_trainer().validate()

    class NoValidation(Regressor):
        validation_step = Regressor.__mro__[1].validation_step  # the TrainModule default

    with pytest.raises(ConfigurationError, match=r"needs NoValidation.validation_step"):
        quiet_trainer().validate(NoValidation(), loader())
