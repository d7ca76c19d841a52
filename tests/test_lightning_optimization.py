"""Optimisation as a Lightning user's module sees it: who steps the LR schedulers, what ``self.optimizers()``
returns, ``manual_backward``'s arguments, and what an overridden ``optimizer_step`` runs."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer import Trainer
from trainer.callbacks import ModelCheckpoint
from trainer.demos.boring_classes import BoringModel
from trainer.strategies.errors import ConfigurationError
from helpers import Regressor, loader, quiet_trainer


class ManualWithStepLR(Regressor):
    """Manual optimisation with a StepLR the user steps once per epoch, as Lightning's docs show."""

    def __init__(self, scheduler: str = "step") -> None:
        super().__init__(lr=1.0)
        self.automatic_optimization = False
        self.scheduler_kind = scheduler

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y) * 1e-3
        self.manual_backward(loss)
        optimizer.step()

    def on_train_epoch_end(self):
        scheduler = self.lr_schedulers()
        if self.scheduler_kind == "plateau":
            scheduler.step(1.0)  # the same metric every epoch: no improvement
        else:
            scheduler.step()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        if self.scheduler_kind == "plateau":  # no "monitor": the user steps it with the metric
            return [optimizer], [torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)]
        if self.scheduler_kind == "custom":
            return [optimizer], [Halving(optimizer)]
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)]


class Halving:
    """A scheduler that is not a torch one (no ``optimizer`` attribute, ``step()`` only)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._groups = optimizer.param_groups

    def step(self) -> None:
        for group in self._groups:
            group["lr"] /= 2

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_manual_optimisation_never_steps_the_lr_scheduler_itself():
    model = ManualWithStepLR()
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=0)
    trainer.fit(model, loader(n=32))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-2)  # two steps, the user's


@pytest.mark.parametrize("kind, lr", [("plateau", 0.5), ("custom", 0.25)])  # plateau: the 2nd epoch is no better
def test_manual_optimisation_accepts_plateau_without_monitor_and_non_torch_schedulers(kind, lr):
    model = ManualWithStepLR(kind)
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=0)
    trainer.fit(model, loader(n=32))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(lr)


def test_automatic_optimisation_still_asks_plateau_for_its_monitor():
    class Plateau(Regressor):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)]

    with pytest.raises(ConfigurationError, match="monitor"):
        quiet_trainer(max_epochs=1).fit(Plateau(), loader(n=16))


def test_self_optimizers_in_automatic_optimisation_is_the_wrapped_optimizer():
    seen = {}

    class ReadsItsOptimizer(Regressor):
        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            seen["lr"] = optimizer.param_groups[0]["lr"]
            seen["wraps"] = optimizer.optimizer is self.trainer.optimizers[0]
            seen["methods"] = callable(optimizer.step) and callable(optimizer.zero_grad)
            seen["raw"] = self.optimizers(use_pl_optimizer=False) is self.trainer.optimizers[0]
            return super().training_step(batch, batch_idx)

    quiet_trainer(max_steps=1).fit(ReadsItsOptimizer(lr=0.05), loader(n=16))
    assert seen == {"lr": 0.05, "wraps": True, "methods": True, "raw": True}


def test_self_optimizers_with_several_optimizers_is_a_list_of_wrapped_ones():
    seen = {}

    class TwoOptimizers(Regressor):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            first, second = self.optimizers()
            seen["lrs"] = [first.param_groups[0]["lr"], second.param_groups[0]["lr"]]
            seen["wrapped"] = [first.optimizer, second.optimizer] == self.trainer.optimizers

        def configure_optimizers(self):
            return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.2)]

    quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0).fit(TwoOptimizers(), loader(n=16))
    assert seen == {"lrs": [0.1, 0.2], "wrapped": True}


def test_manual_backward_passes_its_arguments_to_backward():
    class TwoBackwards(Regressor):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            optimizer.zero_grad()
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.manual_backward(loss, retain_graph=True)  # the graph is kept for a second backward
            self.manual_backward(loss)
            optimizer.step()

    model = TwoBackwards()
    before = [p.detach().clone() for p in model.parameters()]
    quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0).fit(model, loader(n=16))
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


class StepRecorder(Regressor):
    """Records the order of training_step, the zero_grad hooks, backward and the optimizer step."""

    def __init__(self, call_closure: bool = True, step: bool = True) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.call_closure, self.do_step = call_closure, step

    def training_step(self, batch, batch_idx):
        self.calls.append("training_step")
        return super().training_step(batch, batch_idx)

    def on_before_zero_grad(self, optimizer):
        self.calls.append("on_before_zero_grad")

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.calls.append("optimizer_zero_grad")
        optimizer.zero_grad()

    def on_before_backward(self, loss):
        self.calls.append("on_before_backward")

    def on_before_optimizer_step(self, optimizer):
        self.calls.append("on_before_optimizer_step")

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self.calls.append("optimizer_step:enter")
        if self.do_step:
            optimizer.step(closure=optimizer_closure)
        elif self.call_closure:
            optimizer_closure()
        self.calls.append("optimizer_step:exit")


def test_an_overridden_optimizer_step_runs_the_forward_and_backward_in_its_closure():
    model = StepRecorder()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(model, loader(n=32))
    one_step = ["optimizer_step:enter", "training_step", "on_before_zero_grad", "optimizer_zero_grad",
                "on_before_backward", "on_before_optimizer_step", "optimizer_step:exit"]  # fmt: skip
    assert model.calls == one_step * 2
    assert trainer.global_step == 2


def test_with_accumulation_the_window_starts_with_zero_grad_and_ends_inside_optimizer_step():
    model = StepRecorder()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, accumulate_grad_batches=2)
    trainer.fit(model, loader(n=32))
    assert model.calls == [
        "training_step", "on_before_zero_grad", "optimizer_zero_grad", "on_before_backward",
        "optimizer_step:enter", "training_step", "on_before_backward", "on_before_optimizer_step", "optimizer_step:exit",
    ]  # fmt: skip


def test_optimizer_step_that_runs_only_the_closure_skips_the_step():
    model = StepRecorder(step=False)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(model, loader(n=32))
    assert model.calls.count("training_step") == 2 and "on_before_optimizer_step" not in model.calls
    assert trainer.global_step == 0 and all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_optimizer_step_that_never_runs_the_closure_is_an_error():
    with pytest.raises(ConfigurationError, match="closure"):
        quiet_trainer(max_epochs=1, limit_train_batches=1).fit(StepRecorder(call_closure=False, step=False), loader())


class EpochScheduled(Regressor):
    """StepLR stepped per epoch; records the learning rate training and validation see."""

    def __init__(self) -> None:
        super().__init__(lr=1.0)
        self.seen: list[tuple[str, int, float]] = []

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(("batch_end", batch_idx, self.optimizers().param_groups[0]["lr"]))

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self.seen.append(("validation", self.current_epoch, self.optimizers().param_groups[0]["lr"]))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def test_an_epoch_scheduler_steps_at_the_last_batch_before_validation(tmp_path):
    model = EpochScheduled()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, filename="{step}")
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, callbacks=[checkpoint],
                            enable_checkpointing=True)  # fmt: skip
    trainer.fit(model, loader(n=32), loader(n=16))
    # Lightning: the last batch's on_train_batch_end and the epoch's validation already see the stepped rate.
    assert model.seen == [("batch_end", 0, 1.0), ("batch_end", 1, 0.5), ("validation", 0, 0.5)]
    saved = torch.load(tmp_path / "step=2.ckpt", weights_only=True)
    assert saved["lr_schedulers"][0]["last_epoch"] == 1  # saved on the last batch: after the epoch's step


def test_the_plain_fast_path_and_the_layered_path_train_the_same_weights():
    """Overriding optimizer_zero_grad moves zero_grad before the backward (Lightning's order): same training."""

    class ZeroGradOverride(Regressor):
        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            optimizer.zero_grad(set_to_none=True)

    weights = []
    for cls in (Regressor, ZeroGradOverride):
        torch.manual_seed(0)
        model = cls()
        quiet_trainer(max_epochs=2, limit_val_batches=0, accumulate_grad_batches=3).fit(model, loader(n=64))
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.allclose(a, b) for a, b in zip(*weights))


def test_module_without_optimizer_step_override_keeps_the_direct_step():
    """A module overriding nothing of the step runs the one-call step (no hook would see the difference)."""
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(Regressor(), loader(n=16))
    optimization = trainer._optimization
    assert optimization.plain and optimization.runner(1) == optimization._run_plain


def test_gradients_kept_after_the_step_are_released_before_validation():
    """Lightning's on_validation_model_zero_grad: a module whose gradients outlive the step (it implements a
    zero-grad hook) validates without them; the hook can be overridden to keep them."""
    seen = []

    class KeepsGradients(Regressor):
        def on_before_zero_grad(self, optimizer):
            pass

        def validation_step(self, batch, batch_idx):
            if not self.trainer.sanity_checking:
                seen.append(all(p.grad is None for p in self.parameters()))

    class KeepsThemInValidation(KeepsGradients):
        def on_validation_model_zero_grad(self):
            pass

    for cls, released in ((KeepsGradients, True), (KeepsThemInValidation, False)):
        seen.clear()
        quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1).fit(cls(), loader(n=32), loader(n=8))
        assert seen == [released], cls.__name__


@pytest.mark.parametrize("save_on_train_epoch_end", [False, True])
def test_a_step_interval_plateau_scheduler_steps_after_the_batch_validation(tmp_path, save_on_train_epoch_end):
    """As in Lightning, a step-interval ReduceLROnPlateau steps after its batch's validation (the other step-interval
    schedulers right after the optimizer step): a checkpoint saved at validation's end holds it one step behind."""
    seen = {}

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            self.log("foo", float(batch_idx))
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters())
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return [optimizer], [{"scheduler": plateau, "interval": "step", "monitor": "foo"},
                                 {"scheduler": step, "interval": "step"}]

        def on_save_checkpoint(self, checkpoint):
            seen["plateau_last_epoch"] = checkpoint["lr_schedulers"][0]["last_epoch"]
            seen["step_count"] = checkpoint["lr_schedulers"][1]["_step_count"]

    trainer = Trainer(default_root_dir=tmp_path, enable_progress_bar=False, logger=False, enable_model_summary=False,
                      max_epochs=1, limit_train_batches=4, limit_val_batches=1,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path, save_on_train_epoch_end=save_on_train_epoch_end)])
    trainer.fit(Model())
    assert seen["plateau_last_epoch"] == (4 if save_on_train_epoch_end else 3)
    assert seen["step_count"] - 1 == 4


def test_resuming_from_a_checkpoint_saved_before_a_plateau_step_steps_it_and_ends_the_same(tmp_path):
    """A checkpoint saved at an in-epoch validation's end holds the step-interval ReduceLROnPlateau before its step
    (Lightning's order); the resumed fit steps it first, so it ends with the learning rates and weights of the fit
    that never stopped."""

    class Plateau(BoringModel):
        def validation_step(self, batch, batch_idx):
            self.log("worsening", float(self.trainer.global_step))  # never improves: the rate halves every step

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
            return [optimizer], [{"scheduler": plateau, "interval": "step", "monitor": "worsening"}]

    def fit(root, ckpt_path=None):
        torch.manual_seed(0)
        model = Plateau()
        trainer = Trainer(default_root_dir=root, max_epochs=2, limit_train_batches=4, val_check_interval=1,
                          limit_val_batches=1, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                          enable_model_summary=False,
                          callbacks=[ModelCheckpoint(dirpath=root, save_top_k=-1, save_on_train_epoch_end=False,
                                                     filename="{step}")])  # fmt: skip
        trainer.fit(model, ckpt_path=ckpt_path)
        return model, trainer

    whole, whole_trainer = fit(tmp_path / "whole")
    saved = torch.load(tmp_path / "whole" / "step=2.ckpt", weights_only=False)
    assert saved["loops"]["fit"]["plateau_pending"] is True
    resumed, resumed_trainer = fit(tmp_path / "resumed", ckpt_path=tmp_path / "whole" / "step=2.ckpt")
    assert resumed_trainer.optimizers[0].param_groups[0]["lr"] == whole_trainer.optimizers[0].param_groups[0]["lr"]
    assert whole_trainer.optimizers[0].param_groups[0]["lr"] < 0.1 / 2**3
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


class TaggedSGD(torch.optim.SGD):
    """An optimizer whose ``step`` takes an extra argument, as some third-party optimizers' do."""

    def __init__(self, params, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.received: list[tuple[bool, dict]] = []

    def step(self, closure=None, **kwargs):
        self.received.append((closure is not None, kwargs))
        return super().step(closure)


def test_optimizer_step_arguments_reach_the_optimizer_in_manual_and_automatic_optimisation():
    class Manual(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()

            def closure():
                loss = self.step(batch)
                opt.zero_grad()
                self.manual_backward(loss)
                return loss

            opt.step(closure=closure, tag="manual")

        def configure_optimizers(self):
            return TaggedSGD(self.parameters(), lr=0.1)

    class Automatic(Manual):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = True

        def training_step(self, batch, batch_idx):
            return self.step(batch)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            optimizer.step(closure=optimizer_closure, tag="automatic")

    manual, automatic = Manual(), Automatic()
    quiet_trainer(max_steps=2, limit_val_batches=0).fit(manual)
    assert manual.optimizers().optimizer.received == [(True, {"tag": "manual"})] * 2  # the closure too
    quiet_trainer(max_steps=2, limit_val_batches=0).fit(automatic)  # (the closure ran before the step here)
    assert [kwargs for _, kwargs in automatic.optimizers().optimizer.received] == [{"tag": "automatic"}] * 2


def test_manual_zero_grad_does_not_call_on_before_zero_grad():
    class Manual(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.before_zero_grad = 0

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self.step(batch))
            opt.step()
            assert self.layer.weight.grad is not None

        def on_before_zero_grad(self, optimizer):
            self.before_zero_grad += 1

    model = Manual()
    quiet_trainer(max_steps=3, limit_val_batches=0).fit(model)
    assert model.before_zero_grad == 0 and model.trainer.global_step == 3


class OwnBackward(BoringModel):
    """Overrides ``backward`` as Lightning users do (here: record the loss it gets, then the usual backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.step_losses: list[float] = []
        self.backward_losses: list[float] = []
        self.backward_kwargs: list[dict] = []

    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        self.step_losses.append(output["loss"].item())
        return output

    def on_before_backward(self, loss):
        self.calls.append("on_before_backward")

    def backward(self, loss, *args, **kwargs):
        self.calls.append("backward")
        self.backward_losses.append(loss.item())
        self.backward_kwargs.append(kwargs)
        loss.backward(*args, **kwargs)

    def on_after_backward(self):
        self.calls.append("on_after_backward")


def test_an_overridden_backward_gets_the_accumulation_divided_loss_between_the_backward_hooks():
    model = OwnBackward()
    quiet_trainer(max_steps=2, accumulate_grad_batches=2, limit_val_batches=0).fit(model)
    assert model.calls == ["on_before_backward", "backward", "on_after_backward"] * 4
    assert model.backward_losses == pytest.approx([loss / 2 for loss in model.step_losses])
    assert model.trainer.global_step == 2


def test_an_overridden_backward_trains_the_same_weights_as_the_default_one():
    torch.manual_seed(0)
    own = OwnBackward()
    torch.manual_seed(0)
    default = BoringModel()
    for model in (own, default):
        torch.manual_seed(1)  # the same random batches
        quiet_trainer(max_steps=3, limit_val_batches=0).fit(model)
    assert torch.equal(own.layer.weight, default.layer.weight)


def test_an_overridden_backward_gets_the_loss_scaled_by_16_mixed():
    from trainer.strategies.precision import MixedPrecision

    model = OwnBackward()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    quiet_trainer(max_steps=1, limit_val_batches=0, precision=MixedPrecision("16-mixed", scaler=scaler)).fit(model)
    assert model.backward_losses == pytest.approx([loss * 2.0**8 for loss in model.step_losses], rel=1e-3)


def test_manual_backward_calls_an_overridden_backward_with_its_arguments():
    class Manual(OwnBackward):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            loss = self.step(batch)
            self.manual_backward(loss, retain_graph=True)
            self.manual_backward(loss)  # the graph was kept
            opt.step()

    model = Manual()
    quiet_trainer(max_steps=2, limit_val_batches=0).fit(model)
    assert model.calls == ["on_before_backward", "backward", "on_after_backward"] * 4
    assert model.backward_kwargs == [{"retain_graph": True}, {}] * 2
