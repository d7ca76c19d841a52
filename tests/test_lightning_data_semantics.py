"""A Lightning project's data code behaves as on Lightning 2.6 after the rename (issue 25): when each dataloader is
requested, ``reload_dataloaders_every_n_epochs``, ``overfit_batches``, ``fast_dev_run``'s logger, nested
``CombinedLoader``s and their modes in evaluation, the validation sampler's ``set_epoch``, iterator-style steps,
whole-float batch limits and ``DataModule.from_datasets``. Each test is written as a Lightning user writes it.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler, TensorDataset

from trainer import CombinedLoader, DataModule, Trainer, TrainModule
from trainer.callbacks import Callback
from trainer.strategies import ConfigurationError


class RandomDataset(Dataset):
    """Lightning's demo dataset: ``length`` random vectors of ``size`` (drawn from the global RNG)."""

    def __init__(self, size: int, length: int) -> None:
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return len(self.data)


class BoringModel(TrainModule):
    """Lightning's demo module: one linear layer, random data of 64 samples for every stage."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        return self(batch).sum()

    def validation_step(self, batch, batch_idx):
        self.log("x", self(batch).sum())

    def test_step(self, batch, batch_idx):
        self.log("y", self(batch).sum())

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self):
        return DataLoader(RandomDataset(32, 64))


def quiet(**kwargs) -> Trainer:
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)


# ------------------------------------------------------------------------------------- when loaders are requested
@pytest.mark.parametrize(
    ("sanity_steps", "check_val_every", "reload_every", "train_epochs", "val_epochs"),
    [
        (0, 2, 2, [0, 2, 4, 6, 8], [1, 3, 5, 7, 9]),  # the example
        (1, 2, 2, [0, 2, 4, 6, 8], [1, 3, 5, 7, 9]),
        (1, 1, 2, [0, 2, 4, 6, 8], [2, 4, 6, 8]),  # the sanity check's request counts for epoch 0
        (0, 3, 4, [0, 4, 8], [2, 8]),
        (1, 1, 1, list(range(10)), list(range(1, 10))),
    ],
)
def test_reload_dataloaders_requests_them_at_lightnings_epochs(sanity_steps, check_val_every, reload_every,
                                                             train_epochs, val_epochs):  # fmt: skip
    requested = {"train": [], "val": [], "sanity": []}

    class Model(BoringModel):
        def train_dataloader(self):
            requested["train"].append(self.current_epoch)
            return super().train_dataloader()

        def val_dataloader(self):
            requested["sanity" if self.trainer.sanity_checking else "val"].append(self.current_epoch)
            return super().val_dataloader()

    trainer = quiet(limit_train_batches=1, limit_val_batches=1, max_epochs=10, num_sanity_val_steps=sanity_steps,
                    check_val_every_n_epoch=check_val_every, reload_dataloaders_every_n_epochs=reload_every)  # fmt: skip
    trainer.fit(Model())
    assert requested == {"train": train_epochs, "val": val_epochs, "sanity": [0] if sanity_steps else []}


class Order(Callback):
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def on_fit_start(self, trainer, module):
        self.calls.append("on_fit_start")

    def on_sanity_check_start(self, trainer, module):
        self.calls.append("on_sanity_check_start")

    def on_sanity_check_end(self, trainer, module):
        self.calls.append("on_sanity_check_end")

    def on_train_start(self, trainer, module):
        self.calls.append("on_train_start")


@pytest.mark.parametrize("sanity_steps", [2, 0])
def test_loaders_are_requested_where_lightning_requests_them(sanity_steps):
    calls: list = []

    class Model(BoringModel):
        def train_dataloader(self):
            calls.append("train_dataloader")
            return super().train_dataloader()

        def val_dataloader(self):
            calls.append("val_dataloader")
            return super().val_dataloader()

    quiet(max_epochs=3, limit_train_batches=2, limit_val_batches=2, num_sanity_val_steps=sanity_steps,
          callbacks=[Order(calls)]).fit(Model())  # fmt: skip
    if sanity_steps:
        assert calls == ["on_fit_start", "on_sanity_check_start", "val_dataloader", "on_sanity_check_end",
                         "train_dataloader", "on_train_start"]  # fmt: skip
    else:  # no sanity check: validation's loader when validation first runs
        assert calls == ["on_fit_start", "train_dataloader", "on_train_start", "val_dataloader"]


def test_overfit_batches_reads_a_custom_sampler_in_order_too():
    """Lightning turns off any sampler that is not a SequentialSampler under overfit_batches, not only shuffle=True."""

    class Backwards(torch.utils.data.Sampler):
        def __init__(self, dataset):
            self.size = len(dataset)

        def __iter__(self):
            return iter(range(self.size - 1, -1, -1))

        def __len__(self):
            return self.size

    class Model(BoringModel):
        def __init__(self):
            super().__init__()
            self.first_values = []
            self.dataset = RandomDataset(32, 64)

        def training_step(self, batch, batch_idx):
            self.first_values.append(batch[0, 0].item())
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            return DataLoader(self.dataset, sampler=Backwards(self.dataset))

    model = Model()
    with pytest.warns(UserWarning, match="requested to overfit but enabled train dataloader shuffling"):
        quiet(max_epochs=1, overfit_batches=2, limit_val_batches=0).fit(model)
    assert model.first_values == [model.dataset[0][0].item(), model.dataset[1][0].item()]  # the dataset's first two, in order


def test_overfit_batches_validates_on_the_same_batch_it_trains_on():
    class Model(BoringModel):
        def __init__(self):
            super().__init__()
            self.train_batches, self.val_batches = [], []

        def training_step(self, batch, batch_idx):
            self.train_batches.append(batch)
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            self.val_batches.append(batch)

        def val_dataloader(self):
            return DataLoader(RandomDataset(32, 64), shuffle=True)

    model = Model()
    trainer = quiet(max_epochs=2, overfit_batches=1)
    with pytest.warns(UserWarning, match="requested to overfit but enabled val dataloader shuffling"):
        trainer.fit(model)
    assert len(model.train_batches) == 2 and len(model.val_batches) == 1 + 2  # sanity check, then each epoch
    assert all(torch.equal(batch, model.train_batches[0]) for batch in model.train_batches + model.val_batches)
    assert isinstance(trainer.val_dataloaders.sampler, SequentialSampler)


# ---------------------------------------------------------------------------------------------- fast_dev_run
def test_fast_dev_run_gives_a_dummy_logger_whose_experiment_accepts_any_call(tmp_path):
    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.logger.experiment.add_scalar("loss", loss, self.global_step)  # TensorBoard's call, a no-op here
            self.logger.log_metrics({"loss": loss.detach().item()})
            return loss

    trainer = Trainer(accelerator="cpu", fast_dev_run=True, default_root_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(Model())
    assert trainer.global_step == 1 and list(tmp_path.iterdir()) == []  # nothing was written
    assert Trainer(fast_dev_run=True, logger=False).loggers == []


@pytest.mark.parametrize(("given", "read_back"), [(1, True), (True, True), (5, 5), (0, 0), (False, False)])
def test_fast_dev_run_reads_back_as_in_lightning(given, read_back):
    value = Trainer(accelerator="cpu", fast_dev_run=given, logger=False).fast_dev_run
    assert value == read_back and type(value) is type(read_back)


# ---------------------------------------------------------------------------------------------- loader forms
def sized(length: int) -> DataLoader:
    return DataLoader(RandomDataset(32, length))


@pytest.mark.parametrize(("mode", "batches"), [("min_size", 16), ("max_size_cycle", 64), ("max_size", 64)])
def test_a_dict_of_lists_of_loaders_is_combined_in_its_shape(mode, batches):
    class Model(BoringModel):
        def train_dataloader(self):
            return CombinedLoader({"a_b": [sized(64), sized(16)], "c_d_e": [sized(16), sized(16), sized(16)]}, mode)

        def training_step(self, batch, batch_idx):
            assert set(batch) == {"a_b", "c_d_e"} and len(batch["a_b"]) == 2 and len(batch["c_d_e"]) == 3
            if mode == "max_size" and batch_idx >= 16:
                assert batch["a_b"][1] is None and batch["c_d_e"] == [None, None, None]
            return super().training_step(batch["a_b"][0], batch_idx)

    trainer = quiet(max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(Model())
    assert trainer.num_training_batches == batches


def test_train_dataloader_gives_the_loaders_in_the_shape_they_were_passed():
    class Model(BoringModel):
        def train_dataloader(self):
            return [DataLoader(RandomDataset(32, 8), shuffle=True), DataLoader(RandomDataset(32, 4))]

        def training_step(self, batch, batch_idx):
            seen.append(self.trainer.train_dataloader)
            return super().training_step(batch[0], batch_idx)

    seen: list = []
    trainer = quiet(max_epochs=1, limit_val_batches=0)
    trainer.fit(Model())
    loaders = trainer.train_dataloader
    assert isinstance(loaders, list) and [len(dl) for dl in loaders] == [8, 4] and seen[0] is loaders
    assert [type(dl.sampler) for dl in loaders] == [RandomSampler, SequentialSampler]
    single = quiet(max_epochs=1, limit_val_batches=0)
    single.fit(BoringModel())
    assert next(iter(single.train_dataloader)).shape == (1, 32)  # one loader: itself, yielding batches


@pytest.mark.parametrize("mode", ["min_size", "max_size_cycle", "max_size"])
def test_combined_loaders_in_validate_test_and_predict_give_one_batch_of_each(mode):
    steps: list = []

    class Model(BoringModel):
        def validation_step(self, batch, batch_idx):  # no dataloader_idx: one combined loader
            steps.append(("val", batch_idx, [None if b is None else b.shape[0] for b in batch]))

        def test_step(self, batch, batch_idx):
            steps.append(("test", batch_idx, [None if b is None else b.shape[0] for b in batch]))

        def predict_step(self, batch, batch_idx):
            return [b for b in batch if b is not None]

    def combined():
        return CombinedLoader([DataLoader(RandomDataset(32, 4), batch_size=2),
                               DataLoader(RandomDataset(32, 2), batch_size=2)], mode)  # fmt: skip

    trainer = quiet()
    model = Model()
    trainer.validate(model, combined(), verbose=False)
    trainer.test(model, combined(), verbose=False)
    predictions = trainer.predict(model, combined())
    per_stage = 1 if mode == "min_size" else 2
    assert [s[:2] for s in steps] == [("val", i) for i in range(per_stage)] + [("test", i) for i in range(per_stage)]
    second = {"min_size": [], "max_size_cycle": [[2, 2]], "max_size": [[2, None]]}[mode]
    assert [s[2] for s in steps if s[0] == "val"] == [[2, 2]] + second
    assert len(predictions) == per_stage and trainer.num_test_batches == [per_stage]


class EpochRecordingSampler(SequentialSampler):
    """A sampler that records the epochs it was told (validation shuffled by training progress, say)."""

    def __init__(self, data) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_the_validation_samplers_set_epoch_is_called_at_each_validation():
    dataset = RandomDataset(32, 4)
    sampler = EpochRecordingSampler(dataset)

    class Model(BoringModel):
        def val_dataloader(self):
            return DataLoader(dataset, sampler=sampler)

    trainer = quiet(max_epochs=2, limit_train_batches=2)
    model = Model()
    trainer.fit(model)
    assert sampler.epochs == [0, 0, 1]  # the sanity check, then the validation of epochs 0 and 1
    trainer.validate(model, verbose=False)
    assert sampler.epochs[-1] == 2  # after fit: the epochs fit completed


def test_iterator_style_steps_take_their_own_batches():
    taken: dict = {"train": [], "val": []}

    class Model(BoringModel):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            taken["train"].append((batch_idx, dataloader_idx))
            return super().training_step(batch.to(self.device), batch_idx)

        def validation_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            taken["val"].append((batch_idx, dataloader_idx, batch.shape[0]))

        def val_dataloader(self):
            return DataLoader(RandomDataset(32, 6), batch_size=2)

        def predict_step(self, dataloader_iter):
            batch, batch_idx, _ = next(dataloader_iter)
            return batch_idx, batch.shape[0]

    trainer = quiet(max_epochs=1, limit_train_batches=4, num_sanity_val_steps=0)
    model = Model()
    trainer.fit(model)
    assert taken["train"] == [(0, 0), (1, 0), (2, 0), (3, 0)] and trainer.global_step == 4
    assert taken["val"] == [(0, 0, 2), (1, 0, 2), (2, 0, 2)]  # called until the loader is done
    assert trainer.predict(model, DataLoader(RandomDataset(32, 5), batch_size=2)) == [(0, 2), (1, 2), (2, 1)]

    class Lazy(Model):
        def validation_step(self, dataloader_iter):
            pass  # takes nothing: it would be called forever

    with pytest.raises(RuntimeError, match=r"validation_step\(dataloader_iter\) returned without taking a batch"):
        quiet(max_epochs=1, limit_train_batches=1, num_sanity_val_steps=0).fit(Lazy())


def test_a_whole_float_above_one_counts_batches_as_in_lightning():
    trainer = quiet(limit_test_batches=1e50, limit_train_batches=2.0, max_epochs=1, limit_val_batches=0)
    assert trainer.limit_test_batches == int(1e50) and trainer.limit_train_batches == 2
    model = BoringModel()
    trainer.fit(model)
    trainer.test(model, verbose=False)
    assert trainer.global_step == 2 and trainer.num_test_batches == [64]
    assert quiet(val_check_interval=2.0, overfit_batches=3.0).val_check_interval == 2
    with pytest.raises(ConfigurationError, match=r"limit_test_batches=1.5 is a fraction outside \[0.0, 1.0\]"):
        quiet(limit_test_batches=1.5)


def test_val_check_interval_reads_one_epoch_when_not_given_and_under_fast_dev_run():
    assert quiet().val_check_interval == 1.0
    assert quiet(check_val_every_n_epoch=None).val_check_interval == 1.0  # the default is not a refused fraction
    trainer = quiet(fast_dev_run=2, val_check_interval=0.25)
    assert trainer.val_check_interval == 1.0
    model = BoringModel()
    trainer.fit(model)
    assert trainer.global_step == 2 and trainer.num_val_batches == [2]  # validated once, at the epoch's end


# ---------------------------------------------------------------------------------------------- DataModule
def test_datamodule_from_datasets_serves_each_stage():
    class Sized(DataModule):
        def __init__(self, batch_size: int = 1) -> None:
            super().__init__()
            self.batch_size = batch_size

    data = TensorDataset(torch.randn(12, 32))
    datamodule = Sized.from_datasets(train_dataset=data, val_dataset={"a": data, "b": data}, test_dataset=data,
                                     batch_size=4)  # fmt: skip
    assert datamodule.batch_size == 4  # the subclass's __init__ takes it
    assert isinstance(datamodule.train_dataloader().sampler, RandomSampler)
    assert [len(dl) for dl in datamodule.val_dataloader().values()] == [3, 3]

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch[0], batch_idx)

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("v", self(batch[0]).sum())

        def test_step(self, batch, batch_idx):
            self.log("t", self(batch[0]).sum())

    trainer = quiet(max_epochs=1)
    trainer.fit(Model(), datamodule=datamodule)
    assert trainer.num_training_batches == 3 and trainer.num_val_batches == [3, 3]
    assert trainer.test(Model(), datamodule=datamodule, verbose=False)[0].keys() == {"t"}
    assert DataModule.from_datasets(predict_dataset=data).predict_dataloader().batch_size == 1
    with pytest.raises(TypeError, match="Tensor is not a torch Dataset"):
        DataModule.from_datasets(train_dataset=torch.randn(3))


# ---------------------------------------------------------------------------------------------- two DDP ranks
@pytest.mark.timeout(300)
def test_two_ddp_ranks_request_loaders_as_lightning_and_a_rank_zero_read_does_not_hang():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "NODE_RANK", "MASTER_ADDR")}  # fmt: skip
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, str(root / "tests" / "scripts" / "ddp_lightning_data.py")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=190)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = sorted((json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
                      if line.startswith("RESULT")), key=lambda r: r["rank"])  # fmt: skip
    assert [r["rank"] for r in results] == [0, 1], done.stdout[-4000:] + done.stderr[-4000:]
    rank0, rank1 = results
    # Lightning's order: validation's loader in the sanity check, training's after it, then the reloads (every
    # epoch here: training's at the epoch's start, validation's when validation runs).
    assert rank1["calls"] == [["val_dataloader", 0, True], ["train_dataloader", 0], ["on_train_start", 4],
                              ["train_dataloader", 1], ["val_dataloader", 1, False]]  # fmt: skip
    # Rank 0's callback read trainer.train_dataloader in on_fit_start: that requested it early (already split in
    # two by the distributed sampler), without a collective, and the ranks still agree on 4 batches.
    rest = [call for call in rank1["calls"] if call != ["train_dataloader", 0]]
    assert rank0["calls"] == [["train_dataloader", 0], ["read", 4]] + rest
    assert rank0["val_batches"] == rank1["val_batches"] == 2 + 2 * 2  # sanity check, then 2 epochs of 2 per rank
    assert rank0["state"] == rank1["state"] == ["fit", "finished"]


def test_a_loader_set_in_on_fit_start_is_the_one_fit_trains_on():
    class Smaller(Callback):
        def on_fit_start(self, trainer, module):
            trainer.reset_train_dataloader(DataLoader(RandomDataset(32, 3)))

    requested: list = []

    class Model(BoringModel):
        def train_dataloader(self):
            requested.append(self.current_epoch)
            return super().train_dataloader()

    trainer = quiet(max_epochs=1, limit_val_batches=0, callbacks=[Smaller()])
    trainer.fit(Model())
    assert trainer.global_step == 3 and trainer.num_training_batches == 3 and requested == []


def test_a_datamodules_batch_transfer_hooks_take_precedence_and_it_hears_of_exceptions():
    seen: list = []

    class Data(DataModule):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 4), batch_size=2)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen.append("datamodule")
            return batch * 0

        def on_exception(self, exception):
            seen.append(f"on_exception: {exception}")

    class Model(BoringModel):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen.append("module")
            return batch

        def training_step(self, batch, batch_idx):
            assert not batch.any()  # the datamodule's hook ran
            return super().training_step(batch, batch_idx)

    quiet(max_epochs=1, limit_val_batches=0).fit(Model(), datamodule=Data())
    assert seen == ["datamodule", "datamodule"]

    class Failing(Model):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        quiet(max_epochs=1, limit_val_batches=0).fit(Failing(), datamodule=Data())
    assert seen[-1] == "on_exception: boom"
