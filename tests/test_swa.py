"""StochasticWeightAveraging computes what a hand-written torch.optim.swa_utils loop computes, recomputes
BatchNorm statistics, resumes exactly from a checkpoint and rejects bad arguments with clear errors."""
from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

from trainer.callbacks import Callback, ModelCheckpoint, StochasticWeightAveraging
from helpers import loader, quiet_trainer
from launching import finish, start
from trainer.strategies.errors import ConfigurationError
from test_ddp_processes import clean_env
from trainer import TrainModule

EPOCHS, START, SWA_LR, ANNEAL = 6, 3, 0.02, 2


def _net(batch_norm: bool = False, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    if batch_norm:
        return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def _step_lr(params):
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)


def _lambda_lr(params):
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.8**epoch)


class Wrapped(TrainModule):
    def __init__(self, net: nn.Module, make=_step_lr) -> None:
        super().__init__()
        self.net = net
        self.make = make

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        optimizer, scheduler = self.make(self.parameters())
        return [optimizer], [scheduler]


def _hand_loop(net: nn.Module, data, strategy: str) -> tuple[AveragedModel, SWALR]:
    """The torch.optim.swa_utils recipe: SWALR and an epoch-end average from epoch START on."""
    optimizer, scheduler = _step_lr(net.parameters())
    swa_model, swa_scheduler = AveragedModel(net), None
    for epoch in range(EPOCHS):
        if epoch == START:
            swa_scheduler = SWALR(optimizer, swa_lr=SWA_LR, anneal_epochs=ANNEAL, anneal_strategy=strategy)
        for x, y in data:
            nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        if epoch >= START:
            swa_model.update_parameters(net)
            swa_scheduler.step()
        else:
            scheduler.step()
    return swa_model, swa_scheduler


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].double(), b[name].double(), atol=1e-6, rtol=0), f"{name} differs"


@pytest.mark.parametrize("swa_epoch_start, strategy", [(START, "cos"), (START / EPOCHS, "linear")])
def test_matches_a_hand_written_swa_utils_loop(swa_epoch_start, strategy):
    data = loader(n=48, batch_size=8)
    reference = _net()
    module = Wrapped(copy.deepcopy(reference))
    swa_model, swa_scheduler = _hand_loop(reference, data, strategy)

    swa = StochasticWeightAveraging(SWA_LR, swa_epoch_start, annealing_epochs=ANNEAL, annealing_strategy=strategy)
    trainer = quiet_trainer(max_epochs=EPOCHS, callbacks=[swa])
    trainer.fit(module, data)

    assert swa.swa_start == START and swa.n_averaged == EPOCHS - START
    assert type(trainer.lr_schedulers[0]) is SWALR
    assert trainer.lr_schedulers[0].get_last_lr() == pytest.approx(swa_scheduler.get_last_lr())
    _assert_same(dict(module.net.named_parameters()), dict(swa_model.module.named_parameters()))


def test_batch_norm_statistics_are_recomputed_for_the_averaged_weights():
    data = loader(n=48, batch_size=8)
    reference = _net(batch_norm=True)
    module = Wrapped(copy.deepcopy(reference))
    swa_model, _ = _hand_loop(reference, data, "cos")
    update_bn(data, swa_model)

    trainer = quiet_trainer(max_epochs=EPOCHS, callbacks=[StochasticWeightAveraging(SWA_LR, START, ANNEAL)])
    trainer.fit(module, data)

    stats = module.net[1].running_mean.clone()
    _assert_same(module.net.state_dict(), swa_model.module.state_dict())  # weights and running stats
    assert not torch.allclose(stats, reference[1].running_mean)  # the trained net's own stats were replaced


class SaveEachEpoch(Callback):
    """Saves with trainer.save_checkpoint at each epoch end, before the module's and the SWA callback's epoch-end
    hooks."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def on_train_epoch_end(self, trainer, module):
        trainer.save_checkpoint(self.folder / f"epoch={trainer.current_epoch}.ckpt")


@pytest.mark.parametrize("saver", ["ModelCheckpoint", "save_checkpoint"])
@pytest.mark.parametrize("resume_epoch", [1, 4, EPOCHS - 1])  # before SWA, during it, after the last epoch
def test_resume_from_an_epoch_end_checkpoint_ends_with_the_same_weights(tmp_path, resume_epoch, saver):
    data = loader(n=48, batch_size=8)
    folder = tmp_path / "ckpt"

    def fit(ckpt_path=None, seed=0):
        module = Wrapped(_net(batch_norm=True, seed=seed), make=_lambda_lr)
        swa = StochasticWeightAveraging(SWA_LR, START / EPOCHS, ANNEAL)
        if saver == "ModelCheckpoint":
            callbacks = [swa, ModelCheckpoint(dirpath=folder, filename="{epoch}", save_top_k=-1)]
        else:
            callbacks = [SaveEachEpoch(folder), swa]
        trainer = quiet_trainer(max_epochs=EPOCHS, callbacks=callbacks, enable_checkpointing=saver == "ModelCheckpoint")
        trainer.fit(module, data, ckpt_path=ckpt_path)
        return module

    uninterrupted = fit()
    path = folder / f"epoch={resume_epoch}.ckpt"
    saved = torch.load(path, weights_only=True)
    assert saved["epoch"] == resume_epoch
    state = saved["callbacks"]["StochasticWeightAveraging"]
    assert state["started"] is (resume_epoch >= START)
    if state["started"]:
        # A callback saving in on_train_epoch_end before the module's hook (Lightning's order for callbacks that
        # monitor nothing) saves an epoch whose end is not done: the resumed fit runs it, SWA's update included.
        done = saver == "ModelCheckpoint"
        assert int(state["average_model"]["n_averaged"]) == resume_epoch - START + done

    resumed = fit(ckpt_path=path, seed=1)  # different initial weights: everything must come from the checkpoint
    _assert_same(resumed.state_dict(), uninterrupted.state_dict())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(swa_lrs=0.0), "swa_lrs=0.0"),
        (dict(swa_lrs=[0.1, -1.0]), "positive float"),
        (dict(swa_lrs="0.1"), "swa_lrs='0.1'"),
        (dict(swa_lrs=True), "swa_lrs=True"),
        (dict(swa_lrs=0.1, swa_epoch_start=-1), "swa_epoch_start=-1"),
        (dict(swa_lrs=0.1, swa_epoch_start=1.0), "float in (0, 1)"),
        (dict(swa_lrs=0.1, swa_epoch_start=0.0), "swa_epoch_start=0.0"),
        (dict(swa_lrs=0.1, swa_epoch_start=True), "swa_epoch_start=True"),
        (dict(swa_lrs=0.1, annealing_epochs=-1), "annealing_epochs=-1"),
        (dict(swa_lrs=0.1, annealing_epochs=2.5), "int >= 0"),
        (dict(swa_lrs=0.1, annealing_strategy="exp"), "'cos' or 'linear'"),
        (dict(swa_lrs=0.1, avg_fn=3), "avg_fn=3"),
        (dict(swa_lrs=0.1, device="nowhere"), "device='nowhere'"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StochasticWeightAveraging(**kwargs)


class TwoOptimizers(Wrapped):
    def __init__(self) -> None:
        super().__init__(_net())
        self.automatic_optimization = False

    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]


@pytest.mark.parametrize(
    "module, trainer_kwargs, swa_kwargs, message",
    [
        (None, dict(max_steps=4), {}, r"needs Trainer\(max_epochs=...\)"),
        (None, dict(max_epochs=3), dict(swa_epoch_start=3), r"swa_epoch_start=3\) is past the last epoch"),
        (None, dict(max_epochs=3), dict(swa_lrs=[0.1, 0.2]), "2 learning rates but the optimizer has 1 param group"),
        (TwoOptimizers, dict(max_epochs=3), {}, "exactly one optimizer; configure_optimizers returned 2"),
    ],
)
def test_unusable_fit_configurations_raise_clear_errors(module, trainer_kwargs, swa_kwargs, message):
    module = module() if module is not None else Wrapped(_net())
    swa = StochasticWeightAveraging(**{"swa_lrs": 0.05, **swa_kwargs})
    with pytest.raises(ConfigurationError, match=message):
        quiet_trainer(callbacks=[swa], **trainer_kwargs).fit(module, loader(n=16))


_SHARDED_FIT = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
from trainer.callbacks import StochasticWeightAveraging
from trainer import Trainer, TrainModule

class Net(TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

trainer = Trainer(accelerator="cpu", devices=1, strategy=sys.argv[1], max_epochs=2, logger=False,
                  enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                  callbacks=[StochasticWeightAveraging(0.05)])
trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4))
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
@pytest.mark.parametrize("strategy", ["fsdp", "zero2"])
def test_sharded_strategies_are_refused(tmp_path, strategy):
    # A script of its own: a sharded strategy's launcher re-runs the command, which cannot be pytest.
    script = tmp_path / "sharded_fit.py"
    script.write_text(_SHARDED_FIT)
    output = finish(start([sys.executable, str(script), strategy], clean_env()), timeout=120, expect=1)
    assert f"ConfigurationError: StochasticWeightAveraging does not support sharded strategies (strategy='{strategy}')" in output


def test_fit_ending_before_swa_starts_warns_and_keeps_the_trained_weights():
    module = Wrapped(_net())
    trainer = quiet_trainer(max_epochs=4, max_steps=3, callbacks=[StochasticWeightAveraging(0.05, swa_epoch_start=2)])
    with pytest.warns(UserWarning, match="before SWA started"):
        trainer.fit(module, loader(n=16))
    assert type(trainer.lr_schedulers[0]) is torch.optim.lr_scheduler.StepLR
