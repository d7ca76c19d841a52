"""The Trainer members a Lightning user's callbacks read, with Lightning 2.6's values (issue 25): ``trainer.state``
(``fn``/``stage``/``status``, importable from ``trainer.trainer.states`` as from ``lightning.pytorch.trainer.states``),
the dataloader and batch-count members, the callback shortcuts, the accelerator and device count, Lightning's DDP
strategy names, and a multi-node Trainer built on a machine without the cluster's variables.
"""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.accelerators import CPUAccelerator
from trainer.callbacks import Callback, EarlyStopping
from trainer.strategies import ConfigurationError, DDPStrategy
from trainer.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus


def data(n: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 4)), batch_size=2)


class Model(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val", self.layer(batch[0]).sum())

    def test_step(self, batch, batch_idx):
        self.log("test", self.layer(batch[0]).sum())

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class StateRecorder(Callback):
    def __init__(self) -> None:
        self.seen: dict[str, tuple] = {}

    def _record(self, trainer, hook):
        state = trainer.state
        self.seen.setdefault(hook, (state.fn, state.stage, state.status))

    def on_fit_start(self, trainer, module):
        self._record(trainer, "on_fit_start")

    def on_sanity_check_start(self, trainer, module):
        self._record(trainer, "on_sanity_check_start")

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._record(trainer, "on_train_batch_start")

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._record(trainer, "on_validation_batch_start")

    def on_test_start(self, trainer, module):
        self._record(trainer, "on_test_start")

    def on_predict_start(self, trainer, module):
        self._record(trainer, "on_predict_start")


def test_trainer_state_reports_lightnings_fn_stage_and_status():
    recorder = StateRecorder()
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, callbacks=[recorder])  # fmt: skip
    assert trainer.state == TrainerState(TrainerStatus.INITIALIZING, None, None)
    model = Model()
    trainer.fit(model, data(), data())
    trainer.test(model, data(), verbose=False)
    trainer.predict(model, data())
    running = TrainerStatus.RUNNING
    assert recorder.seen == {
        "on_fit_start": (TrainerFn.FITTING, RunningStage.TRAINING, running),
        "on_sanity_check_start": (TrainerFn.FITTING, RunningStage.SANITY_CHECKING, running),
        "on_train_batch_start": (TrainerFn.FITTING, RunningStage.TRAINING, running),
        "on_validation_batch_start": (TrainerFn.FITTING, RunningStage.VALIDATING, running),
        "on_test_start": (TrainerFn.TESTING, RunningStage.TESTING, running),
        "on_predict_start": (TrainerFn.PREDICTING, RunningStage.PREDICTING, running),
    }
    assert trainer.state.fn == "predict" and trainer.state.stage is None and trainer.state.finished
    assert recorder.seen["on_fit_start"][0] == "FIT" and RunningStage.SANITY_CHECKING.evaluating  # as LightningEnum

    class Failing(Model):
        def training_step(self, batch, batch_idx):
            raise ValueError("boom")

    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False)  # fmt: skip
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(Failing(), data())
    assert trainer.state.status == TrainerStatus.INTERRUPTED and trainer.interrupted and trainer.state.stopped


def test_the_members_lightning_callbacks_read():
    stopper = EarlyStopping(monitor="val")
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, callbacks=[stopper],
                      enable_model_summary=False)  # fmt: skip
    assert isinstance(trainer.accelerator, CPUAccelerator) and trainer.num_devices == 1 and trainer.device_ids == [0]
    assert trainer.early_stopping_callback is stopper and trainer.early_stopping_callbacks == [stopper]
    assert type(trainer.progress_bar_callback).__name__ == "RichProgressBar"
    assert Trainer(accelerator="cpu", enable_progress_bar=False, logger=False).progress_bar_callback is None
    assert trainer.test_dataloaders is None and trainer.num_test_batches == []

    model = Model()
    seen: dict = {}

    class Reader(Callback):
        def on_train_start(self, trainer, module):
            seen["enable_validation"] = trainer.enable_validation

    trainer.callbacks.append(Reader())
    trainer.fit(model, data(), data(4))
    assert seen == {"enable_validation": True} and trainer.num_val_batches == [2]
    test_loaders = [data(4), data(6)]
    trainer.test(model, test_loaders, verbose=False)
    assert trainer.test_dataloaders == test_loaders and trainer.num_test_batches == [2, 3]
    trainer.predict(model, data(2))
    assert trainer.num_predict_batches == [1] and isinstance(trainer.predict_dataloaders, DataLoader)
    trainer.validate(model, {"a": data(4), "b": data(2)}, verbose=False)  # given back in the shape passed
    assert list(trainer.val_dataloaders) == ["a", "b"] and trainer.num_val_batches == [2, 1]

    without_val = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, limit_val_batches=0)  # fmt: skip
    without_val.fit(Model(), data(), data())
    assert without_val.enable_validation is False


@pytest.mark.parametrize(
    ("name", "start_method", "find_unused"),
    [("ddp_find_unused_parameters_false", "popen", False), ("ddp_find_unused_parameters_true", "popen", True),
     ("ddp_spawn_find_unused_parameters_false", "spawn", False), ("ddp_spawn_find_unused_parameters_true", "spawn", True),
     ("ddp_fork_find_unused_parameters_true", "fork", True), ("ddp_notebook_find_unused_parameters_false", "fork", False)],
)  # fmt: skip
def test_lightnings_ddp_strategy_names_build_ddp(name, start_method, find_unused):
    trainer = Trainer(accelerator="cpu", devices=2, strategy=name, logger=False)
    strategy = trainer.strategy
    assert isinstance(strategy, DDPStrategy) and strategy.start_method == start_method
    assert strategy.ddp_kwargs["find_unused_parameters"] is find_unused


def test_a_multi_node_trainer_builds_without_the_cluster_variables_and_explains_at_fit(monkeypatch):
    for name in ("NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name in [key for key in os.environ if key.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)
    trainer = Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", logger=False)
    assert trainer.num_nodes == 2 and trainer.world_size == 4
    with pytest.raises(ConfigurationError, match="num_nodes=2 needs NODE_RANK and MASTER_ADDR in the environment"):
        trainer.fit(Model(), data())
    assert "LOCAL_RANK" not in os.environ  # nothing was launched


def test_the_migration_tables_trainer_members_exist_or_give_a_reason():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "migrating_from_lightning.md").read_text()
    section = text.split("## Trainer members\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    trainer = Trainer(accelerator="cpu", logger=False)
    wrong = [name for name, (status, notes) in rows.items()
             if hasattr(trainer, name) == (status == "not supported") or (status == "not supported" and len(notes) < 40)]
    assert not wrong, f"rows that do not match the Trainer: {wrong}"
    assert {"state", "test_dataloaders", "progress_bar_callback", "accelerator", "num_devices", "num_test_batches",
            "early_stopping_callback", "enable_validation"} <= {n for n, (status, _) in rows.items() if status == "same"}


def test_is_last_batch_marks_each_epochs_last_training_batch():
    marks: list = []

    class Marks(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            marks.append(trainer.is_last_batch)

    trainer = Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, callbacks=[Marks()])  # fmt: skip
    trainer.fit(Model(), data(6))
    assert marks == [False, False, True] * 2
