"""Loop, optimisation and Trainer-flag behaviour a ported Lightning project relies on, written as a Lightning user
writes a module: what the loop runs, which messages and warnings appear, which misuses are refused."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

from trainer import Callback, Trainer
from trainer.callbacks import EarlyStopping
from trainer.demos.boring_classes import BoringModel
from trainer.strategies import ConfigurationError


def quiet(**kwargs) -> Trainer:
    kwargs = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
              "enable_model_summary": False, **kwargs}  # fmt: skip
    return Trainer(**kwargs)


def test_freeze_and_unfreeze_return_the_module():
    model = BoringModel()
    assert model.freeze() is model and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.unfreeze() is model and model.training
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    "argument, value, says",
    [
        ("limit_train_batches", 1.0, "100% of the batches per epoch will be used."),
        ("limit_val_batches", 1.0, "100% of the batches will be used."),
        ("val_check_interval", 1.0, "validation will run at the end of the training epoch."),
        ("overfit_batches", 1, "1 batch will be used."),
        ("overfit_batches", 1.0, "100% of the batches will be used."),
    ],
)
def test_an_explicit_one_or_one_point_zero_says_what_it_means(caplog, argument, value, says):
    with caplog.at_level(logging.INFO):
        quiet(**{argument: value})
    assert f"`Trainer({argument}={value})` was configured so {says}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        quiet()  # the defaults say nothing
    assert "was configured so" not in caplog.text


def test_unsupported_keys_of_an_optimizer_dict_warn_and_are_ignored():
    class Model(BoringModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1), "foo": 1}

    with pytest.warns(RuntimeWarning, match=r"unsupported key\(s\) \['foo'\] in the optimizer configuration"):
        quiet(max_steps=1, limit_val_batches=0).fit(Model())


def test_a_scheduler_on_an_optimizer_that_was_not_returned_is_refused():
    class Model(BoringModel):
        def configure_optimizers(self):
            used = torch.optim.SGD(self.layer.parameters(), lr=0.1)
            other = torch.optim.SGD(self.layer.parameters(), lr=0.1)
            return [used], [torch.optim.lr_scheduler.StepLR(other, step_size=1)]

    with pytest.raises(ConfigurationError, match="attached with an optimizer that wasn't returned"):
        quiet(fast_dev_run=True).fit(Model())


def test_limit_train_batches_zero_runs_no_epoch():
    class Model(BoringModel):
        steps = 0

        def training_step(self, batch, batch_idx):
            self.steps += 1
            return super().training_step(batch, batch_idx)

    model = Model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = quiet(max_epochs=2, limit_train_batches=0, limit_val_batches=2)
    trainer.fit(model)
    assert trainer.state.finished and trainer.current_epoch == 0 and model.steps == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_stop_before_min_epochs_is_deferred_and_said_once(caplog):
    class Model(BoringModel):
        steps = 0

        def training_step(self, batch, batch_idx):
            self.steps += 1
            out = super().training_step(batch, batch_idx)
            out["loss"] = out["loss"] * 0.0  # constant: early stopping wants to stop after the first epoch
            self.log("loss", out["loss"])
            return out

    trainer = quiet(min_epochs=3, max_epochs=10, limit_train_batches=2, limit_val_batches=0,
                    callbacks=[EarlyStopping(monitor="loss", patience=0, check_on_train_epoch_end=True)])  # fmt: skip
    model = Model()
    with caplog.at_level(logging.INFO):
        trainer.fit(model)
    assert trainer.current_epoch == 3  # min_epochs ran, then the deferred stop
    assert model.steps == 3 * 2  # the last required epoch runs whole: the stop waits for min_epochs *completed*
    said = [r for r in caplog.records if "`min_epochs=3` or `min_steps=None` has not been met" in r.getMessage()]
    assert len(said) == 1


def test_pl_trainer_environment_variables_set_the_defaults(monkeypatch):
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    trainer = Trainer(accelerator="cpu")
    assert trainer.max_steps == 7 and trainer.logger is None
    trainer = Trainer(accelerator="cpu", max_steps=42, logger=False)  # what the script passes wins
    assert trainer.max_steps == 42
    monkeypatch.setenv("PL_TRAINER_MAX_EPOCHS", "three")  # not a literal: passed as the string, and refused
    with pytest.raises(ConfigurationError, match="max_epochs"):
        Trainer(accelerator="cpu")


def test_a_hook_wrapped_on_the_instance_is_not_an_override():
    """Recording wrappers (``functools.partial``/``update_wrapper`` around the inherited hook, as Lightning's hook
    tests and profiling helpers do) leave the hook as it was: the module's transfer hook still runs."""
    from functools import partial, update_wrapper

    from trainer.demos.boring_classes import BoringDataModule

    called = []

    class Recorded(BoringDataModule):
        def __init__(self):
            super().__init__()
            for name in ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"):
                inherited = getattr(self, name)

                def record(hook, fn, *args, **kwargs):
                    called.append(hook)
                    return fn(*args, **kwargs)

                wrapper = partial(record, name, inherited)
                update_wrapper(wrapper, inherited)
                setattr(self, name, wrapper)

    class Model(BoringModel):
        moved = 0

        def on_before_batch_transfer(self, batch, dataloader_idx):
            self.moved += 1
            return batch

    model = Model()
    quiet(max_steps=2, limit_val_batches=0).fit(model, datamodule=Recorded())
    assert model.moved == 2 and called == []


def test_max_epochs_is_resolved_when_fit_starts():
    from trainer import Callback

    class StopAtOnce(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            trainer.should_stop = True

    trainer = quiet(limit_val_batches=0, callbacks=[StopAtOnce()])
    assert trainer.max_epochs is None and trainer.max_steps == -1  # as Lightning: None until fit resolves it
    with pytest.warns(UserWarning, match="`max_epochs` was not set. Setting it to 1000 epochs"):
        trainer.fit(BoringModel())
    assert trainer.max_epochs == 1000
    trainer = quiet(max_steps=1, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # max_steps ends the run: no warning
        trainer.fit(BoringModel())
    assert trainer.max_epochs == -1


@pytest.mark.parametrize(
    "argument", [{"enable_checkpointing": True}, {"logger": True}, {"enable_progress_bar": True},
                 {"enable_model_summary": True}, {"log_every_n_steps": 1}, {"num_sanity_val_steps": 1},
                 {"fast_dev_run": True}],  # fmt: skip
)
def test_barebones_refuses_what_it_turns_off_when_passed_explicitly(argument):
    (name, value), = argument.items()
    with pytest.raises(ValueError, match=rf"`Trainer\(barebones=True, {name}={value!r}\)` was passed"):
        Trainer(accelerator="cpu", barebones=True, **argument)
    trainer = Trainer(accelerator="cpu", barebones=True)  # the defaults are fine: barebones turns them off
    assert trainer.logger is None and not trainer.enable_checkpointing


def test_barebones_still_accepts_the_values_it_would_set():
    Trainer(accelerator="cpu", barebones=True, logger=False, enable_checkpointing=False, num_sanity_val_steps=0)


def test_predict_step_returning_none_warns_once():
    class Model(BoringModel):
        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return None if batch_idx % 2 else self(batch)

    with pytest.warns(UserWarning, match="predict returned None") as record:
        predictions = quiet(limit_predict_batches=4).predict(Model())
    assert sum("predict returned None" in str(w.message) for w in record) == 1
    assert predictions[1] is None and predictions[0].shape == (1, 2)


def test_what_automatic_optimisation_cannot_do_is_the_runtime_error_lightning_raises():
    class TakesOptimizerIdx(BoringModel):
        def training_step(self, batch, batch_idx, optimizer_idx):
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="Remove the `optimizer_idx` argument from `training_step`") as error:
        quiet(max_steps=1).fit(TakesOptimizerIdx())
    assert isinstance(error.value, ConfigurationError)

    class TwoOptimizers(BoringModel):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters()), torch.optim.Adam(self.parameters())

    with pytest.raises(RuntimeError, match="multiple optimizers is only supported with manual optimization"):
        quiet(max_steps=1).fit(TwoOptimizers())


def test_a_none_batch_skips_its_training_step_with_a_warning():
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.collate import default_collate

    from trainer.demos.boring_classes import RandomDataset

    class Model(BoringModel):
        def __init__(self):
            super().__init__()
            self.counter = 0
            self.outputs = []
            self.started = []

        def drop_even(self, batch):
            self.counter += 1
            return None if self.counter % 2 else default_collate(batch)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 4), collate_fn=self.drop_even)

        def on_train_batch_start(self, batch, batch_idx):
            self.started.append(batch_idx)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.outputs.append(outputs)

    model = Model()
    trainer = quiet(max_epochs=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match="train_dataloader yielded None"):
        trainer.fit(model)
    assert [o is None for o in model.outputs] == [True, False, True, False]
    assert model.started == [1, 3] and trainer.global_step == 2


def test_toggle_optimizer_inside_a_compiled_function_runs_eagerly():
    """toggle/untoggle flip ``requires_grad``, which Dynamo cannot trace: they run outside the compiled graph."""
    from torch import nn

    class Gan(BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.other = nn.Linear(32, 2)
            self.frozen_during_step = []

            def step(batch, opt):
                self.toggle_optimizer(opt)
                self.frozen_during_step.append(not self.other.weight.requires_grad)
                loss = self.layer(batch).sum()
                self.untoggle_optimizer(opt)
                return loss

            self.compiled_step = torch.compile(step, backend="eager")

        def training_step(self, batch, batch_idx):
            opt_a, _ = self.optimizers()
            loss = self.compiled_step(batch, opt_a)
            self.manual_backward(loss)
            opt_a.step()
            opt_a.zero_grad()

        def configure_optimizers(self):
            return (torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.SGD(self.other.parameters(), lr=0.1))

    model = Gan()
    quiet(max_steps=2, limit_val_batches=0).fit(model)
    assert model.frozen_during_step == [True, True]
    assert model.other.weight.requires_grad  # untoggled after each step


def test_self_optimizers_is_an_instance_of_the_optimizer_class():
    import pickle

    from trainer.core.optimizer import LightningOptimizer

    class Model(BoringModel):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    model = Model()
    quiet(max_steps=1, limit_val_batches=0).fit(model)
    optimizer = model.optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and isinstance(optimizer, LightningOptimizer)
    assert str(optimizer) == "Lightning" + str(optimizer.optimizer)  # "LightningAdam (...)", as Lightning prints it
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # accepted: it is an Optimizer
    scheduler.step()
    assert optimizer.optimizer.param_groups[0]["lr"] == 0.005

    by_hand = LightningOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))  # wraps any optimizer
    state = by_hand.state_dict()
    state["param_groups"][0]["lr"] = 1.0
    by_hand.load_state_dict(state)  # reaches the torch optimizer, not a copy on the wrapper
    assert by_hand.optimizer.param_groups[0]["lr"] == 1.0 == by_hand.param_groups[0]["lr"]
    assert pickle.loads(pickle.dumps(by_hand)).param_groups[0]["lr"] == 1.0


def test_is_overridden_answers_as_the_trainer_decides():
    from functools import partial, update_wrapper

    from trainer import Callback
    from trainer.utilities.model_helpers import is_overridden

    class Model(BoringModel):
        def on_train_start(self):
            pass

    model = Model()
    assert is_overridden("training_step", model) and is_overridden("on_train_start", model)
    assert not is_overridden("on_train_end", model) and not is_overridden("training_step", None)
    wrapped = partial(lambda fn: fn(), model.on_train_end)
    update_wrapper(wrapped, model.on_train_end)
    model.on_train_end = wrapped  # a recording wrapper around the inherited hook: still not an override
    assert not is_overridden("on_train_end", model)
    model.validation_step = None  # Lightning's way to switch a stage off
    assert not is_overridden("validation_step", model)

    class Watch(Callback):
        def on_fit_start(self, trainer, pl_module):
            pass

    assert is_overridden("on_fit_start", Watch()) and not is_overridden("on_fit_end", Watch())
    with pytest.raises(ConfigurationError, match="needs parent="):
        is_overridden("forward", torch.nn.Linear(1, 1))


def test_eval_batch_hooks_written_without_dataloader_idx_work_with_one_loader():
    seen = []

    class Model(BoringModel):
        def on_validation_batch_start(self, batch, batch_idx):  # Lightning's hooks default dataloader_idx
            seen.append(("val", batch_idx))

        def on_test_batch_end(self, outputs, batch, batch_idx):
            seen.append(("test", batch_idx))

        def on_predict_batch_start(self, batch, batch_idx):
            seen.append(("predict", batch_idx))

    trainer = quiet(limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1)
    model = Model()
    trainer.validate(model)
    trainer.test(model)
    trainer.predict(model)
    assert seen == [("val", 0), ("test", 0), ("predict", 0)]


def test_a_stage_limited_to_zero_batches_requests_no_loader_and_runs_no_loop():
    calls = []

    class Model(BoringModel):
        def test_dataloader(self):
            calls.append("test_dataloader")
            return super().test_dataloader()

        def on_test_start(self):
            calls.append("on_test_start")

    assert quiet(limit_test_batches=0).test(Model()) == [] and calls == []


def test_every_stage_starts_without_gradients():
    grads = []

    class Model(BoringModel):
        def on_validation_start(self):
            grads.append(self.layer.weight.grad)

    model = Model()
    model.layer.weight.grad = torch.ones_like(model.layer.weight)  # left over from the user's own code
    quiet(limit_val_batches=1).validate(model)
    assert grads == [None]


def test_default_root_dir_expands_the_home_folder():
    from pathlib import Path

    assert quiet(default_root_dir="~/runs").default_root_dir == str(Path.home() / "runs")
    assert quiet(default_root_dir=Path("~/runs")).default_root_dir == str(Path.home() / "runs")


def test_lr_scheduler_configs_compare_with_lightnings_dataclass():
    from trainer.utilities.types import LRSchedulerConfig

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("foo", out["loss"])
            return out

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "foo"}}

    trainer = quiet(max_steps=2, limit_val_batches=0)
    trainer.fit(Model())
    config = trainer.lr_scheduler_configs[0]
    assert config == LRSchedulerConfig(scheduler=config.scheduler, monitor="foo", interval="epoch", frequency=1,
                                       reduce_on_plateau=True, strict=True, name=None)  # fmt: skip


def test_test_without_a_model_after_fit_evaluates_the_best_checkpoint(tmp_path):
    from trainer.callbacks import ModelCheckpoint

    class Model(BoringModel):
        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            self.log("score", float(self.current_epoch))  # epoch 0 is the best (lowest)
            return out

    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=1)
    trainer = Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=2, limit_val_batches=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoint])  # fmt: skip
    model = Model()
    trainer.fit(model)
    with pytest.warns(UserWarning, match="The best model of the previous `fit` call will be used"):
        trainer.test()
    assert trainer.ckpt_path == checkpoint.best_model_path and "epoch=0" in checkpoint.best_model_path
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer.test(model)  # a model passed: its weights as they are, no warning
    assert trainer.ckpt_path is None

    unsaved = quiet(max_steps=1, limit_val_batches=0)
    unsaved.fit(BoringModel())
    with pytest.raises(ValueError, match="best"):  # nothing saved to evaluate: said, not silently the last weights
        unsaved.test()


class _FailsInTraining(BoringModel):
    def training_step(self, batch, batch_idx):
        raise RuntimeError("Error during train")


class _ExceptionCounter(Callback):
    def __init__(self):
        self.exceptions = 0

    def on_exception(self, trainer, pl_module, exception):
        self.exceptions += 1


def test_ddp_spawn_failure_reaches_the_callers_callbacks():
    """ddp_spawn runs the stage on copies of the Trainer in new processes; the Trainer's own callbacks in the
    launching process hear of the failure (on_exception), as in Lightning. One CPU process, spawned for real."""
    counter = _ExceptionCounter()
    trainer = quiet(strategy="ddp_spawn", devices=1, fast_dev_run=True, callbacks=[counter])
    with pytest.raises(Exception, match="Error during train"):
        trainer.fit(_FailsInTraining())
    assert counter.exceptions == 1


def test_a_second_fit_runs_the_sanity_check_and_attaches_its_new_loaders(tmp_path):
    from torch.utils.data import DataLoader

    from trainer.demos.boring_classes import RandomDataset

    class Counting(Callback):
        def __init__(self) -> None:
            self.sanity_checks = 0

        def on_sanity_check_start(self, trainer, module) -> None:
            self.sanity_checks += 1

    counting = Counting()
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, max_steps=1, limit_val_batches=1, callbacks=[counting])  # fmt: skip
    model = BoringModel()
    trainer.fit(model, DataLoader(RandomDataset(32, 64)), DataLoader(RandomDataset(32, 64)))
    second_val = DataLoader(RandomDataset(32, 64))
    trainer.fit_loop.epoch_loop.max_steps += 1
    trainer.fit(model, DataLoader(RandomDataset(32, 64)), second_val)  # as in Lightning: a new fit checks again
    assert counting.sanity_checks == 2 and trainer.global_step == 2
    assert trainer.val_dataloaders.dataset is second_val.dataset
    resumed = Trainer(accelerator="cpu", default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, max_steps=3, limit_val_batches=1, callbacks=[Counting()])  # fmt: skip
    resumed.fit(BoringModel(), ckpt_path=trainer.checkpoint_callback.best_model_path)  # a resumed fit does not
    assert resumed.callbacks[0].sanity_checks == 0 and resumed.global_step == 3
