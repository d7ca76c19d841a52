"""What a Lightning project's ``self.log`` calls send to its loggers after the rename, as Lightning 2.6 sends it:
step values logged in validation/test, the keyword call with an integer ``epoch``, the names with several
evaluation loaders, ``add_dataloader_idx=False``, Python's ``max`` as ``reduce_fx``, and ``pl_module.log`` from a
callback."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import ConfigurationError, Trainer, TrainModule
from trainer.callbacks import Callback
from trainer.loggers import Logger


class KeywordLogger(Logger):
    """A logger written as Lightning's docs write one: ``log_metrics(self, metrics, step)`` called by keyword."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def log_metrics(self, metrics, step):  # no default for step: a positional-only caller would still work
        self.calls.append({"metrics": dict(metrics), "step": step})

    def keys(self) -> set[str]:
        return {key for call in self.calls for key in call["metrics"]}


class StrictKeywordLogger(KeywordLogger):
    def log_metrics(self, *, metrics, step):  # keyword-only: fails if the Trainer passes them positionally
        super().log_metrics(metrics, step)


def data(n: int = 12, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class LitModel(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer_with(logger: Logger, **kwargs) -> Trainer:
    options = dict(accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)


class StepValuesInEvaluation(LitModel):
    def validation_step(self, batch, batch_idx):
        self.log("val_step_only", float(batch_idx), on_step=True, on_epoch=False)
        self.log("val_both", float(batch_idx), on_step=True, on_epoch=True)

    def test_step(self, batch, batch_idx):
        self.log("test_step_only", float(batch_idx), on_step=True, on_epoch=False)


def test_step_values_logged_in_validation_and_test_reach_the_logger_once_per_batch():
    logger = StrictKeywordLogger()
    trainer = trainer_with(logger, max_epochs=2)
    model = StepValuesInEvaluation()
    trainer.fit(model, data(), data(12, seed=1))

    step_only = [(c["step"], c["metrics"]["val_step_only"]) for c in logger.calls if "val_step_only" in c["metrics"]]
    # One call per validation batch, the step counting the validation batches over the whole fit.
    assert step_only == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 0.0), (4, 1.0), (5, 2.0)]
    assert "val_both_step" in logger.keys() and "val_both_epoch" in logger.keys()
    assert "val_step_only" in trainer.logged_metrics and "val_both_epoch" in trainer.logged_metrics
    per_batch = [c for c in logger.calls if "val_step_only" in c["metrics"]]
    assert all("epoch" not in c["metrics"] for c in per_batch)  # Lightning adds no epoch to per-batch evaluation values
    # What callbacks monitor in evaluation are the epoch values (as in Lightning).
    assert "val_step_only" not in trainer.callback_metrics and "val_both" in trainer.callback_metrics

    tester = StrictKeywordLogger()
    trainer_with(tester).test(model, data(8), verbose=False)
    assert [(c["step"], c["metrics"]["test_step_only"]) for c in tester.calls if "test_step_only" in c["metrics"]] == [
        (0, 0.0), (1, 1.0)
    ]  # fmt: skip


def test_the_logger_gets_keywords_and_an_integer_epoch_which_stays_out_of_logged_metrics():
    logger = StrictKeywordLogger()
    trainer = trainer_with(logger, max_epochs=2)
    trainer.fit(LitModel(), data())
    train_calls = [c for c in logger.calls if "train_loss" in c["metrics"]]
    assert [c["step"] for c in train_calls] == [0, 1, 2, 3, 4, 5]
    epochs = [c["metrics"]["epoch"] for c in train_calls]
    assert epochs == [0, 0, 0, 1, 1, 1] and all(type(e) is int for e in epochs)
    assert "epoch" not in trainer.logged_metrics and "train_loss" in trainer.logged_metrics


def test_a_logged_step_value_is_the_step_the_logger_gets():
    class LogsItsStep(LitModel):
        def on_train_epoch_end(self):
            self.log("step", 100.0 + self.current_epoch)
            self.log("marker", 1.0)

    logger = KeywordLogger()
    trainer_with(logger, max_epochs=2).fit(LogsItsStep(), data())
    ends = [c for c in logger.calls if "marker" in c["metrics"]]
    assert [c["step"] for c in ends] == [100, 101]
    assert all("step" not in c["metrics"] and "epoch" not in c["metrics"] for c in ends)


class TwoLoaders(LitModel):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("x", F.mse_loss(self.layer(x), y), on_step=True, on_epoch=True)
        self.log(f"own_{dataloader_idx}", float(dataloader_idx), add_dataloader_idx=False)

    def on_validation_epoch_end(self):
        self.log("everywhere", 7.0)


def test_several_evaluation_loaders_name_keys_as_lightning_and_keep_unindexed_keys_in_their_loader():
    logger = KeywordLogger()
    results = trainer_with(logger).validate(TwoLoaders(), [data(8), data(8, seed=1)], verbose=False)
    assert set(results[0]) == {"x_epoch/dataloader_idx_0", "own_0", "everywhere"}
    assert set(results[1]) == {"x_epoch/dataloader_idx_1", "own_1", "everywhere"}
    assert {"x_step/dataloader_idx_0", "x_step/dataloader_idx_1", "x_epoch/dataloader_idx_0"} <= logger.keys()
    assert "x/dataloader_idx_0_epoch" not in logger.keys()


def test_the_same_unindexed_name_from_two_loaders_is_refused():
    class Mixed(LitModel):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("acc", 1.0, add_dataloader_idx=False)

    with pytest.raises(ConfigurationError, match="from dataloader 0 and from dataloader 1"):
        trainer_with(False).validate(Mixed(), [data(4), data(4)], verbose=False)


def test_python_builtin_max_min_sum_are_accepted_as_reduce_fx():
    class Reduces(LitModel):
        def validation_step(self, batch, batch_idx):
            self.log("biggest", float(batch_idx), reduce_fx=max)
            self.log("smallest", float(batch_idx) + 1, reduce_fx=min)
            self.log("total", 1.0, reduce_fx=sum)

    [result] = trainer_with(False).validate(Reduces(), data(12), verbose=False)
    assert result == {"biggest": 2.0, "smallest": 1.0, "total": 3.0}


def test_a_callback_logs_through_the_module_as_in_lightning():
    class LogsFromCallback(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            pl_module.log("from_callback", float(batch_idx))

        def on_validation_epoch_end(self, trainer, pl_module):
            pl_module.log("val_from_callback", 3.0)

    class Validated(LitModel):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", 1.0)

    logger = KeywordLogger()
    trainer = trainer_with(logger, max_epochs=1, callbacks=[LogsFromCallback()])
    trainer.fit(Validated(), data(), data())
    assert [c["metrics"]["from_callback"] for c in logger.calls if "from_callback" in c["metrics"]] == [0.0, 1.0, 2.0]
    assert float(trainer.callback_metrics["val_from_callback"]) == 3.0
    assert "val_from_callback" in logger.keys()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
@pytest.mark.timeout(240)
def test_sync_dist_step_values_in_validation_are_reduced_per_batch_under_ddp():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(root / "tests" / "scripts" / "ddp_eval_step_logging.py")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=190)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    # 16 samples over 2 ranks in batches of 4: 2 validation batches per rank, each the mean of ranks 0 and 1
    assert line.split()[1:] == ["0:0.5", "1:0.5"]


def test_values_logged_in_on_train_start_reach_the_logger_once_as_values_of_the_first_epoch():
    class LogsAtStart(LitModel):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.layer(x), y)

        def on_train_start(self):
            self.log("lr_at_start", 0.5)

    logger = KeywordLogger()
    trainer = trainer_with(logger, max_epochs=3, limit_train_batches=2)
    trainer.fit(LogsAtStart(), data())
    assert [call for call in logger.calls if "lr_at_start" in call["metrics"]] == [
        {"metrics": {"lr_at_start": 0.5, "epoch": 0}, "step": 1}  # the first epoch's end, at its last step
    ]
    assert trainer.callback_metrics["lr_at_start"] == 0.5


def test_on_train_start_refuses_step_values_as_lightning_does():
    class StepAtStart(LitModel):
        def on_train_start(self):
            self.log("at_start", 1.0, on_step=True)

    with pytest.raises(ConfigurationError, match="on_step=True"):
        trainer_with(KeywordLogger(), max_epochs=1, limit_train_batches=1).fit(StepAtStart(), data())


def test_explicit_logger_true_without_a_logger_warns_and_the_default_does_not():
    import inspect
    import warnings

    assert inspect.signature(TrainModule.log).parameters["logger"].default is None  # Lightning's signature

    class Explicit(LitModel):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("explicit", loss, logger=True)
            return loss

    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, max_epochs=1, limit_train_batches=2)  # fmt: skip
    with pytest.warns(UserWarning, match=r"self.log\('explicit', ..., logger=True\)` but have no logger") as seen:
        Trainer(**options).fit(Explicit(), data())
    assert sum("no logger configured" in str(w.message) for w in seen) == 1  # once, not per call
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no logger configured")
        Trainer(**options).fit(LitModel(), data())  # self.log("train_loss", loss): logger left at its default
