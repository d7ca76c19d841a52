"""Which files a Lightning project's ``ModelCheckpoint`` writes after the rename, and what its checkpoints hold,
as in Lightning 2.6: the ``every_n_epochs`` schedule with no save outside it, ``save_last`` with
``save_top_k=0``, ``save_on_exception``, ``to_yaml``, callback state keys and the DataModule's key."""
from __future__ import annotations

import inspect
import os

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Trainer, TrainModule
from trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint


def data(n: int = 8, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class LitModel(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(tmp_path, *callbacks: Callback, model: TrainModule | None = None, ckpt_path=None, **kwargs) -> Trainer:
    options = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0, default_root_dir=tmp_path, callbacks=list(callbacks))  # fmt: skip
    options.update(kwargs)
    trainer = Trainer(**options)
    trainer.fit(model or LitModel(), data(), data(seed=1), ckpt_path=ckpt_path)
    return trainer


def written(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".ckpt"))


def test_every_n_epochs_saves_on_its_schedule_only(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{epoch}", save_top_k=-1, every_n_epochs=2)
    fit(tmp_path, checkpoint, max_epochs=5)
    assert written(tmp_path / "ckpt") == ["epoch=1.ckpt", "epoch=3.ckpt"]  # no save of epoch 4 at the end
    assert checkpoint.every_n_epochs == 2


def test_every_n_epochs_zero_never_saves(tmp_path):
    fit(tmp_path, ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_epochs=0), max_epochs=3)
    assert not (tmp_path / "ckpt").exists() or written(tmp_path / "ckpt") == []


def test_save_last_with_save_top_k_zero_saves_last_once_at_the_end(tmp_path):
    saves: list[str] = []

    class CountSaves(Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            saves.append(trainer.global_step)

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    fit(tmp_path, checkpoint, CountSaves(), max_epochs=2)
    assert written(tmp_path / "ckpt") == ["last.ckpt"] and saves == [4]
    assert checkpoint.last_model_path == str(tmp_path / "ckpt" / "last.ckpt")


def test_save_last_follows_the_every_n_epochs_schedule(tmp_path):
    saves: list[int] = []

    class CountSaves(Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            saves.append(trainer.current_epoch)

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{epoch}", every_n_epochs=2, save_last=True)
    fit(tmp_path, checkpoint, CountSaves(), max_epochs=3)
    assert written(tmp_path / "ckpt") == ["epoch=1.ckpt", "last.ckpt"]
    assert saves == [1]  # last.ckpt is a link to the epoch-1 file, not a save at epochs 0 or 2


def test_save_on_exception_saves_the_state_when_the_fit_raises(tmp_path):
    class Breaks(LitModel):
        def training_step(self, batch, batch_idx):
            if self.global_step == 3:
                raise RuntimeError("data went bad")
            return super().training_step(batch, batch_idx)

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{epoch}-{step}", save_on_exception=True,
                                 every_n_epochs=0)  # fmt: skip
    with pytest.raises(RuntimeError, match="data went bad"):
        fit(tmp_path, checkpoint, model=Breaks(), max_epochs=3)
    assert written(tmp_path / "ckpt") == ["epoch=1-step=3.ckpt"]
    assert torch.load(tmp_path / "ckpt" / "epoch=1-step=3.ckpt", weights_only=True)["global_step"] == 3
    assert "save_on_exception" in inspect.signature(ModelCheckpoint).parameters


def test_to_yaml_writes_the_best_k_models(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss", save_top_k=2, filename="{epoch}")
    fit(tmp_path, checkpoint, max_epochs=3)
    checkpoint.to_yaml()
    saved = yaml.safe_load((tmp_path / "ckpt" / "best_k_models.yaml").read_text())
    assert saved == {path: pytest.approx(float(score)) for path, score in checkpoint.best_k_models.items()}
    assert len(saved) == 2
    checkpoint.to_yaml(tmp_path / "elsewhere.yaml")
    assert yaml.safe_load((tmp_path / "elsewhere.yaml").read_text()).keys() == saved.keys()


class Stopping(EarlyStopping):
    def load_state_dict(self, state_dict):
        self.loaded = dict(state_dict)
        super().load_state_dict(state_dict)


def test_callback_state_keys_keep_lightnings_format_and_old_checkpoints_still_load(tmp_path):
    stopping = EarlyStopping(monitor="val_loss", mode="min")
    assert stopping.state_key == "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"
    assert ModelCheckpoint(monitor="val_loss").state_key == (
        "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
        "'train_time_interval': None}"
    )
    stopping = Stopping(monitor="val_loss", mode="min")
    trainer = fit(tmp_path, stopping, enable_checkpointing=False, max_epochs=2)
    path = tmp_path / "sorted.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert list(checkpoint["callbacks"]) == ["Stopping{'monitor': 'val_loss', 'mode': 'min'}"]
    # a checkpoint of an earlier version, its key sorted: still restores the callback
    state = checkpoint["callbacks"].pop(stopping.state_key)
    checkpoint["callbacks"]["Stopping{'mode': 'min', 'monitor': 'val_loss'}"] = state
    torch.save(checkpoint, path)
    restored = Stopping(monitor="val_loss", mode="min")
    fit(tmp_path, restored, enable_checkpointing=False, max_epochs=3, ckpt_path=path)
    assert restored.loaded["best_score"] == pytest.approx(float(stopping.best_score))


class CountingData(DataModule):
    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def train_dataloader(self):
        return data()

    def state_dict(self):
        return {"loads": self.loads + 1}

    def load_state_dict(self, state_dict):
        self.loads = state_dict["loads"]


def test_a_datamodules_state_is_stored_under_its_class_name_and_the_old_key_still_loads(tmp_path):
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False)  # fmt: skip
    trainer = Trainer(max_epochs=1, **options)
    trainer.fit(LitModel(), datamodule=CountingData())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=True)
    assert checkpoint["CountingData"] == {"loads": 1} and "datamodule" not in checkpoint

    resumed = CountingData()
    Trainer(max_epochs=2, **options).fit(LitModel(), datamodule=resumed, ckpt_path=tmp_path / "a.ckpt")
    assert resumed.loads == 1
    checkpoint["datamodule"] = checkpoint.pop("CountingData")
    torch.save(checkpoint, tmp_path / "old.ckpt")
    old = CountingData()
    Trainer(max_epochs=2, **options).fit(LitModel(), datamodule=old, ckpt_path=tmp_path / "old.ckpt")
    assert old.loads == 1


def test_max_steps_mid_epoch_still_saves_the_epochs_checkpoint(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt")
    fit(tmp_path, checkpoint, max_steps=3)  # 2 batches per epoch: stops in the middle of epoch 1
    assert written(tmp_path / "ckpt") == ["epoch=1-step=3.ckpt"]
    off_schedule = ModelCheckpoint(dirpath=tmp_path / "other", every_n_epochs=2, filename="{epoch}", save_top_k=-1)
    fit(tmp_path, off_schedule, max_steps=5)  # stops in epoch 2: due (every 2nd epoch is 1, 3, ...) only at 1
    assert written(tmp_path / "other") == ["epoch=1.ckpt"]
