"""validate/test/predict, skipped steps, manual optimisation, DataModule and the loop-shaping arguments."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer.callbacks import Callback
from trainer.plugins import MixedPrecision
from helpers import Regressor, loader, quiet_trainer, regression_data
from trainer import DataModule, TrainModule, seed_everything


def test_validate_and_test_return_one_dict_per_dataloader():
    trainer = quiet_trainer()
    module = Regressor()
    single = trainer.validate(module, loader(n=16), verbose=False)
    assert len(single) == 1 and set(single[0]) == {"val_loss"} and isinstance(single[0]["val_loss"], float)

    both = trainer.test(module, [loader(n=16, seed=1), loader(n=16, seed=2)], verbose=False)
    assert len(both) == 2
    assert set(both[0]) == {"test_loss/dataloader_idx_0"} and set(both[1]) == {"test_loss/dataloader_idx_1"}
    assert both[0]["test_loss/dataloader_idx_0"] != both[1]["test_loss/dataloader_idx_1"]
    # the value equals the loss computed by hand over the whole dataset
    x, y = regression_data(16, seed=1).tensors
    with torch.no_grad():
        expected = nn.functional.mse_loss(module(x), y).item()
    assert both[0]["test_loss/dataloader_idx_0"] == pytest.approx(expected, rel=1e-5)


def test_validate_prints_a_table(capsys):
    quiet_trainer().validate(Regressor(), loader(n=16))
    assert "val_loss" in capsys.readouterr().out


def test_predict_returns_outputs_in_order():
    module = Regressor()
    x = torch.randn(20, 4)
    outputs = quiet_trainer().predict(module, DataLoader(x, batch_size=8))
    assert [o.shape[0] for o in outputs] == [8, 8, 4]
    with torch.no_grad():
        assert torch.allclose(torch.cat(outputs), module(x))
    two = quiet_trainer().predict(module, [DataLoader(x, batch_size=10), DataLoader(x, batch_size=20)])
    assert [len(group) for group in two] == [2, 1]


def test_training_step_returning_none_skips_the_backward_but_the_step_still_counts():
    class SkipsOdd(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return None if batch_idx % 2 else loss

    module = SkipsOdd()
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match="`training_step` returned `None`. If this was on purpose") as record:
        trainer.fit(module, loader(n=48, batch_size=8))
    assert trainer.global_step == 6  # as in Lightning: the batches that returned None took an (empty) step too
    assert sum("returned `None`" in str(w.message) for w in record) == 1  # once

    class SkipsAll(Regressor):
        def training_step(self, batch, batch_idx):
            return None

    module = SkipsAll()
    before = copy.deepcopy(module.state_dict())
    trainer = quiet_trainer(max_epochs=1, accumulate_grad_batches=2)
    with pytest.warns(UserWarning, match="without a single optimizer step"):
        trainer.fit(module, loader(n=32, batch_size=8))
    assert trainer.global_step == 2  # one per accumulation window, over no gradients
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


class HalvingEveryStep(TrainModule):
    """A Lightning user's module: SGD with a step-interval StepLR; ``training_step`` returns None on the batches
    in ``skip``; it records the step hooks and what ``on_train_batch_end`` gets."""

    def __init__(self, skip: tuple[int, ...]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)
        self.skip = skip
        self.calls: list[tuple[str, int]] = []
        self.outputs: list = []

    def training_step(self, batch, batch_idx):
        if batch_idx in self.skip:
            return None
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self.calls.append(("optimizer_step", batch_idx))
        optimizer.step(closure=optimizer_closure)

    def on_before_optimizer_step(self, optimizer):
        self.calls.append(("on_before_optimizer_step", self.trainer.global_step))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.outputs.append(outputs)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def by_hand(skip: tuple[int, ...], accumulate: int, batches: list) -> nn.Linear:
    """What Lightning's loop does, written out: the loss of each batch not in ``skip`` (divided by ``accumulate``)
    goes backward; every window ends with an SGD step and a halving of the learning rate."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for i, (x, y) in enumerate(batches):
        if i not in skip:
            (nn.functional.mse_loss(layer(x), y) / accumulate).backward()
        if (i + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
    return layer


def test_a_step_that_returns_none_still_runs_the_step_hooks_and_schedulers_as_in_lightning():
    data = loader(n=32, batch_size=8)
    module = HalvingEveryStep(skip=(1, 2))
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(module, data)
    assert trainer.global_step == 4
    assert [c for c in module.calls if c[0] == "optimizer_step"] == [("optimizer_step", i) for i in range(4)]
    assert [c for c in module.calls if c[0] == "on_before_optimizer_step"] == [
        ("on_before_optimizer_step", i) for i in range(4)]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)  # stepped on every batch
    assert module.outputs[1] == {} and module.outputs[2] == {} and set(module.outputs[0]) == {"loss"}
    reference = by_hand((1, 2), 1, list(data))
    assert torch.allclose(module.layer.weight, reference.weight) and torch.allclose(module.layer.bias, reference.bias)


@pytest.mark.parametrize("skip", [(1,), (0, 1)], ids=["the-window-had-a-loss", "every-step-returned-none"])
def test_a_window_ending_with_none_steps_over_what_it_accumulated(skip):
    data = loader(n=32, batch_size=8)
    module = HalvingEveryStep(skip=skip)
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, accumulate_grad_batches=2)
    trainer.fit(module, data)
    assert trainer.global_step == 2
    assert [c for c in module.calls if c[0] == "optimizer_step"] == [("optimizer_step", 1), ("optimizer_step", 3)]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)
    reference = by_hand(skip, 2, list(data))
    assert torch.allclose(module.layer.weight, reference.weight) and torch.allclose(module.layer.bias, reference.bias)


def test_under_16_mixed_a_step_that_returns_none_runs_the_hook_but_not_the_scaler():
    module = HalvingEveryStep(skip=(1, 2))
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)  # small enough that no real step overflows
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, precision=MixedPrecision("16-mixed", scaler=scaler),
                            gradient_clip_val=1.0)  # fmt: skip
    trainer.fit(module, loader(n=48, batch_size=8))
    assert trainer.global_step == 6 and trainer.skipped_steps == 0
    assert scaler.state_dict()["_growth_tracker"] == 4  # as in Lightning, only the 4 steps with a loss updated the scaler
    assert len([c for c in module.calls if c[0] == "on_before_optimizer_step"]) == 6
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**6)


class TwoOptimizers(TrainModule):
    """Manual optimisation with two optimizers, like a GAN's generator/discriminator steps."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.a = nn.Linear(4, 1)
        self.b = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_a, opt_b = self.optimizers()
        loss_a = nn.functional.mse_loss(self.a(x), y)
        opt_a.zero_grad()
        self.manual_backward(loss_a)
        opt_a.step()
        loss_b = nn.functional.mse_loss(self.b(x), y)
        opt_b.zero_grad()
        self.manual_backward(loss_b)
        self.clip_gradients(opt_b, gradient_clip_val=0.1)
        opt_b.step()
        self.lr_schedulers().step()
        self.log("loss_a", loss_a)

    def configure_optimizers(self):
        opt_a = torch.optim.SGD(self.a.parameters(), lr=0.1)
        opt_b = torch.optim.Adam(self.b.parameters(), lr=0.01)
        return [opt_a, opt_b], [torch.optim.lr_scheduler.StepLR(opt_a, step_size=1, gamma=0.9)]


def test_manual_optimisation_matches_a_hand_written_loop():
    module = TwoOptimizers()
    reference = copy.deepcopy(module)
    data = loader(n=32, batch_size=8)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(module, data)
    assert trainer.global_step == 8  # every optimizer.step() counts

    opt_a = torch.optim.SGD(reference.a.parameters(), lr=0.1)
    opt_b = torch.optim.Adam(reference.b.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(opt_a, step_size=1, gamma=0.9)
    for x, y in data:
        opt_a.zero_grad()
        nn.functional.mse_loss(reference.a(x), y).backward()
        opt_a.step()
        opt_b.zero_grad()
        nn.functional.mse_loss(reference.b(x), y).backward()
        torch.nn.utils.clip_grad_norm_(reference.b.parameters(), 0.1)
        opt_b.step()
        scheduler.step()
    for (name, p), (_, q) in zip(module.named_parameters(), reference.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


class CountingData(DataModule):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{stage}")
        self.train_set = regression_data(32)
        self.val_set = regression_data(16, seed=3)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=8)

    def test_dataloader(self):
        return DataLoader(self.val_set, batch_size=8)

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown:{stage}")

    def state_dict(self):
        return {"calls": len(self.calls)}


def test_datamodule_provides_data_and_its_state_is_checkpointed(tmp_path):
    data = CountingData()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Regressor(), datamodule=data)
    assert data.calls == ["prepare_data", "setup:fit", "teardown:fit"]
    assert trainer.global_step == 4 and "val_loss" in trainer.callback_metrics
    trainer.save_checkpoint(tmp_path / "dm.ckpt")
    assert torch.load(tmp_path / "dm.ckpt", weights_only=True)["CountingData"] == {"calls": 3}  # its __qualname__, as Lightning
    assert "test_loss" in trainer.test(Regressor(), datamodule=data, verbose=False)[0]
    # a DataModule passed positionally works like Lightning
    quiet_trainer(max_epochs=1).fit(Regressor(), CountingData())


class CountsValidation(Callback):
    def __init__(self) -> None:
        self.at: list[tuple[int, int]] = []

    def on_validation_end(self, trainer, module):
        if not trainer.sanity_checking:
            self.at.append((trainer.current_epoch, trainer.global_step))


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"val_check_interval": 0.5}, [(0, 4), (0, 8), (1, 12), (1, 16)]),
        ({"val_check_interval": 3}, [(0, 3), (0, 6), (1, 11), (1, 14)]),
        ({"val_check_interval": 3, "check_val_every_n_epoch": None}, [(0, 3), (0, 6), (1, 9), (1, 12), (1, 15)]),
        ({"check_val_every_n_epoch": 2, "max_epochs": 4}, [(1, 16), (3, 32)]),
    ],
)
def test_when_validation_runs(options, expected):
    counter = CountsValidation()
    settings = {"max_epochs": 2, "num_sanity_val_steps": 0, **options}
    quiet_trainer(callbacks=[counter], **settings).fit(Regressor(), loader(n=64, batch_size=8), loader(n=16))
    assert counter.at == expected


def test_validation_data_without_validation_step_warns_that_it_is_skipped():
    class NoValidation(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(UserWarning, match="NoValidation has no validation_step: validation is skipped"):
        trainer.fit(NoValidation(), loader(n=16), loader(n=8))
    assert trainer.global_step == 2 and not trainer.callback_metrics


def test_sanity_check_runs_without_changing_training():
    def run(sanity: int) -> dict:
        seed_everything(7)
        module = Regressor()
        data = DataLoader(regression_data(32), batch_size=8, shuffle=True)
        val = DataLoader(regression_data(16), batch_size=8, shuffle=True)
        quiet_trainer(max_epochs=2, num_sanity_val_steps=sanity).fit(module, data, val)
        return module.state_dict()

    with_check, without = run(2), run(0)
    assert all(torch.equal(with_check[k], without[k]) for k in with_check)


def test_fast_dev_run_runs_one_batch_of_each_and_writes_nothing(tmp_path):
    counter = CountsValidation()
    trainer = quiet_trainer(fast_dev_run=True, callbacks=[counter], logger=True, default_root_dir=tmp_path)
    trainer.fit(Regressor(), loader(n=64), loader(n=64))
    assert trainer.global_step == 1 and counter.at == [(0, 1)]
    assert [type(lg).__name__ for lg in trainer.loggers] == ["DummyLogger"]  # Lightning's: records nothing
    assert list(tmp_path.iterdir()) == []


def test_min_epochs_delays_a_stop_request():
    class StopsAtOnce(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            trainer.should_stop = True

    trainer = quiet_trainer(max_epochs=10, min_epochs=3, callbacks=[StopsAtOnce()], limit_val_batches=0)
    trainer.fit(Regressor(), loader(n=32, batch_size=8))
    # ignored until 3 epochs are complete (4 steps each), then honoured at once, as in Lightning
    assert trainer.current_epoch == 3 and trainer.global_step == 12


def test_seed_makes_runs_reproducible_and_deterministic_flag_applies():
    def run() -> torch.Tensor:
        trainer = quiet_trainer(max_epochs=1, seed=123)
        module = Regressor()
        trainer.fit(module, DataLoader(regression_data(32), batch_size=8, shuffle=True))
        return module.net[0].weight.detach().clone()

    assert torch.equal(run(), run())
    seen = []

    class Probe(Callback):
        def on_fit_start(self, trainer, module):
            seen.append(torch.are_deterministic_algorithms_enabled())

    previous = torch.are_deterministic_algorithms_enabled()
    quiet_trainer(max_epochs=1, deterministic=True, callbacks=[Probe()]).fit(
        Regressor(), DataLoader(regression_data(16), batch_size=8))
    assert seen == [True] and torch.are_deterministic_algorithms_enabled() == previous  # during the fit only


def test_hyperparameters_saved_and_module_rebuilt_from_checkpoint(tmp_path):
    module = Regressor(hidden=5, lr=0.2)
    assert module.hparams == {"features": 4, "hidden": 5, "lr": 0.2} and module.hparams.lr == 0.2
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(module, loader(n=16))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    restored = Regressor.load_from_checkpoint(tmp_path / "m.ckpt", lr=0.5)
    assert restored.hparams.hidden == 5 and restored.hparams.lr == 0.5
    assert all(torch.equal(a, b) for a, b in zip(restored.parameters(), module.parameters()))


def test_estimated_stepping_batches_is_available_in_configure_optimizers():
    seen = []

    class OneCycle(Regressor):
        def configure_optimizers(self):
            seen.append(self.trainer.estimated_stepping_batches)
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            total = int(self.trainer.estimated_stepping_batches)
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    quiet_trainer(max_epochs=3, accumulate_grad_batches=3).fit(OneCycle(), loader(n=80, batch_size=8))
    assert seen == [12]  # 10 batches → 4 steps per epoch (3 + 3 + 3 + 1), 3 epochs
