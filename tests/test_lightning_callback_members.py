"""Callback members a Lightning project reads after the rename: ``LearningRateMonitor.lrs``, ``EarlyStoppingReason``,
``SimpleProfiler.recorded_durations``, ``TQDMProgressBar(refresh_rate=...)``, ``BackboneFinetuning`` /
``BaseFinetuning`` (resume included) and ``str(datamodule)``."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import ConfigurationError, DataModule, Trainer, TrainModule
from trainer.callbacks import (
    BackboneFinetuning,
    BaseFinetuning,
    Callback,
    EarlyStopping,
    EarlyStoppingReason,
    LearningRateMonitor,
    ModelCheckpoint,
    TQDMProgressBar,
)
from trainer.loggers import CSVLogger
from trainer.profiler import SimpleProfiler


def data(n: int = 16, seed: int = 0) -> DataLoader:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class LitModel(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)}


def trainer(tmp_path, **kwargs) -> Trainer:
    options = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)


def test_learning_rate_monitor_keeps_lrs_and_the_last_momentum(tmp_path):
    monitor = LearningRateMonitor(logging_interval="epoch", log_momentum=True)
    trainer(tmp_path, logger=CSVLogger(tmp_path), max_epochs=3, callbacks=[monitor]).fit(LitModel(), data())
    assert monitor.lrs == {"lr-SGD": [pytest.approx(0.1), pytest.approx(0.05), pytest.approx(0.025)]}
    assert monitor.last_momentum_values == {"lr-SGD-momentum": pytest.approx(0.9)}
    with pytest.raises(ConfigurationError, match="has none"):
        trainer(tmp_path, max_epochs=1, callbacks=[LearningRateMonitor()]).fit(LitModel(), data())


def test_learning_rate_monitor_names_groups_and_schedulers_and_refuses_duplicate_group_names(tmp_path):
    class Named(LitModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD([{"params": self.backbone.parameters(), "name": "backbone"},
                                         {"params": self.head.parameters(), "name": "head"}], lr=0.1)  # fmt: skip
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "name": "my-lr"}}

    monitor = LearningRateMonitor()
    trainer(tmp_path, logger=CSVLogger(tmp_path), max_epochs=1, callbacks=[monitor]).fit(Named(), data())
    assert set(monitor.lrs) == {"my-lr/backbone", "my-lr/head"}

    class Clashing(LitModel):
        def configure_optimizers(self):
            return torch.optim.SGD([{"params": self.backbone.parameters(), "name": "x"},
                                    {"params": self.head.parameters(), "name": "x"}], lr=0.1)  # fmt: skip

    with pytest.raises(ConfigurationError, match="share the names"):
        trainer(tmp_path, logger=CSVLogger(tmp_path), max_epochs=1,
                callbacks=[LearningRateMonitor()]).fit(Clashing(), data())  # fmt: skip


class TwoOptimizers(LitModel):
    """Manual optimisation with an Adam on everything and an SGD (with a scheduler) on the head only."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        for optimizer in self.optimizers():
            self.manual_backward(F.mse_loss(self(batch[0]), batch[1]))
            optimizer.step()
            optimizer.zero_grad()

    def on_train_epoch_end(self):
        self.lr_schedulers().step()

    def configure_optimizers(self):
        adam = torch.optim.Adam(filter(lambda p: p.requires_grad, self.parameters()), lr=0.01)
        sgd = torch.optim.SGD(self.head.parameters(), lr=0.1)
        return [adam, sgd], [torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)]


class AddsBackboneToSGD(BaseFinetuning):
    def freeze_before_training(self, pl_module):
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == 1 and isinstance(optimizer, torch.optim.SGD):
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr=0.001)


def test_learning_rate_monitor_names_optimizers_with_a_scheduler_first_and_follows_added_groups(tmp_path):
    seen: list[list[str]] = []

    class Names(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            seen.append(list(monitor.lrs))

    monitor = LearningRateMonitor(logging_interval="epoch")
    trainer(tmp_path, logger=CSVLogger(tmp_path), max_epochs=3,
            callbacks=[AddsBackboneToSGD(), monitor, Names()]).fit(TwoOptimizers(), data())  # fmt: skip
    # the scheduled SGD comes first although configure_optimizers returned it second
    assert seen[0] == ["lr-SGD", "lr-Adam"]
    # once the SGD has two groups its rates go under /pg1 and /pg2, its history moving to /pg1 (at the end)
    assert seen[1] == seen[2] == ["lr-Adam", "lr-SGD/pg1", "lr-SGD/pg2"]
    assert monitor.lrs["lr-SGD/pg1"] == pytest.approx([0.1, 0.05, 0.025])
    assert monitor.lrs["lr-SGD/pg2"] == pytest.approx([0.001, 0.0005])  # added at 0.001, then halved by the StepLR
    assert monitor.lrs["lr-Adam"] == pytest.approx([0.01] * 3)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (dict(patience=0, min_delta=1e9), EarlyStoppingReason.PATIENCE_EXHAUSTED),  # never improves enough
        (dict(stopping_threshold=1e6), EarlyStoppingReason.STOPPING_THRESHOLD),
        (dict(divergence_threshold=-1.0), EarlyStoppingReason.DIVERGENCE_THRESHOLD),
    ],
)
def test_early_stopping_reason_is_lightnings_enum_with_our_message_beside_it(tmp_path, options, reason):
    stopping = EarlyStopping(monitor="val_loss", **options)
    assert stopping.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    trainer(tmp_path, max_epochs=5, callbacks=[stopping]).fit(LitModel(), data(), data(8, seed=1))
    assert stopping.stopping_reason is reason
    assert isinstance(stopping.stopping_reason_message, str) and "Stopping" in stopping.stopping_reason_message
    restored = EarlyStopping(monitor="val_loss")
    restored.load_state_dict(stopping.state_dict())
    assert restored.stopping_reason is reason


def test_simple_profiler_records_every_call_duration(tmp_path):
    profiler = SimpleProfiler()
    trainer(tmp_path, max_steps=3, profiler=profiler).fit(LitModel(), data())
    steps = [name for name in profiler.recorded_durations if "training_step" in name]
    assert steps and len(profiler.recorded_durations[steps[0]]) == 3
    assert all(d >= 0 for durations in profiler.recorded_durations.values() for d in durations)


class ShardedData(DataModule):
    """A DataModule with every hook Lightning's profiler times: prepare_data, setup, state_dict, teardown."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs_seen = 0

    def prepare_data(self):
        pass

    def setup(self, stage):
        self.loader = data()

    def train_dataloader(self):
        return self.loader

    def state_dict(self):
        return {"epochs_seen": self.epochs_seen}

    def load_state_dict(self, state):
        self.epochs_seen = state["epochs_seen"]


def test_the_simple_profiler_times_the_datamodule_hooks_under_lightnings_names(tmp_path):
    from trainer.profiler.simple import SimpleProfiler as FromLightningsPath

    assert FromLightningsPath is SimpleProfiler
    checkpoints = ModelCheckpoint(dirpath=tmp_path)
    first = trainer(tmp_path, max_steps=1, profiler="simple", callbacks=[checkpoints],
                    enable_checkpointing=True)
    first.fit(LitModel(), datamodule=ShardedData())
    durations = first.profiler.recorded_durations
    for hook in ("prepare_data", "setup", "state_dict", "teardown"):
        assert len(durations[f"[DataModule]ShardedData.{hook}"]) == 1, hook
    assert "[DataModule]ShardedData.load_state_dict" not in durations

    resumed = trainer(tmp_path, max_steps=2, profiler="simple")
    resumed.fit(LitModel(), datamodule=ShardedData(), ckpt_path=checkpoints.best_model_path)
    assert len(resumed.profiler.recorded_durations["[DataModule]ShardedData.load_state_dict"]) == 1
    assert "state_dict" not in vars(resumed.datamodule)  # the timing wrappers are gone after the stage


def test_tqdm_progress_bar_takes_lightnings_arguments(tmp_path):
    bar = TQDMProgressBar(refresh_rate=0)
    run = trainer(tmp_path, max_epochs=1, enable_progress_bar=True, callbacks=[bar])
    assert [cb for cb in run.callbacks if isinstance(cb, TQDMProgressBar)] == [bar]
    run.fit(LitModel(), data())
    assert not bar.is_enabled and bar._display is None  # never drew
    assert TQDMProgressBar(refresh_rate=20).refresh_rate == 20
    with pytest.raises(ConfigurationError, match="refresh_rate"):
        TQDMProgressBar(refresh_rate=-1)


def test_backbone_finetuning_unfreezes_at_its_epoch_and_resumes_with_the_added_group(tmp_path):
    model = LitModel()
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_lr=0.01)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}")
    run = trainer(tmp_path, max_epochs=3, callbacks=[finetuning, checkpoint], enable_checkpointing=True)
    frozen = model.backbone[0].weight.clone()
    run.fit(model, data())
    assert len(run.optimizers[0].param_groups) == 2
    # epoch 2 doubled it (Lightning's default lambda_func); StepLR then halves every group, the added one too
    assert run.optimizers[0].param_groups[1]["lr"] == pytest.approx(0.01 * 2 * 0.5)
    assert not torch.equal(model.backbone[0].weight, frozen)  # trained once unfrozen

    first_epoch = LitModel()
    trainer(tmp_path / "b", max_epochs=1, callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1)]).fit(
        first_epoch, data())
    assert not first_epoch.backbone[0].weight.requires_grad  # frozen before the unfreeze epoch
    assert first_epoch.backbone[1].weight.requires_grad  # BatchNorm trains (train_bn=True)

    resumed, again = LitModel(), BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_lr=0.01)
    rerun = trainer(tmp_path / "c", max_epochs=3, callbacks=[again])
    rerun.fit(resumed, data(), ckpt_path=tmp_path / "ckpt" / "epoch=1.ckpt")  # saved after the group was added
    assert len(rerun.optimizers[0].param_groups) == 2
    assert again.previous_backbone_lr == pytest.approx(0.01 * 2)
    for key, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


class RecordsRates(Callback):
    """After the fine-tuning callback: each epoch's (rest, backbone) learning rates, backbone None while frozen."""

    def __init__(self) -> None:
        self.rates: list[tuple[float, float | None]] = []

    def on_train_epoch_start(self, trainer, pl_module):
        groups = trainer.optimizers[0].param_groups
        self.rates.append((groups[0]["lr"], groups[1]["lr"] if len(groups) > 1 else None))


class HeadOnly(LitModel):
    def configure_optimizers(self):  # the head only, as Lightning's example: the callback adds the backbone
        optimizer = torch.optim.SGD(self.head.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]


@pytest.mark.parametrize(("options", "backbone"), [
    # the default: 0.1 x the rest's rate at the unfreeze epoch, doubled every epoch, then held to the rest's rate
    ({}, [None, None, 0.1 * 0.7 ** 2 * 0.1, 0.1 * 0.7 ** 2 * 0.1 * 2, 0.1 * 0.7 ** 2 * 0.1 * 4, 0.1 * 0.7 ** 5]),
    (dict(backbone_initial_lr=0.001, lambda_func=lambda epoch: 1.0 + epoch / 10),
     [None, None, 0.001, 0.001 * 1.4, 0.001 * 1.4 * 1.5, 0.001 * 1.4 * 1.5 * 1.6]),
    (dict(backbone_initial_ratio_lr=0.5, should_align=False),
     [None, None, 0.1 * 0.7 ** 2 * 0.5, 0.1 * 0.7 ** 2, 0.1 * 0.7 ** 2 * 2, 0.1 * 0.7 ** 2 * 4]),
])  # fmt: skip
def test_backbone_finetuning_learning_rates_per_epoch_are_lightnings(tmp_path, options, backbone):
    recorder = RecordsRates()
    run = trainer(tmp_path, max_epochs=6, limit_val_batches=0,
                  callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=2, **options), recorder])  # fmt: skip
    run.fit(HeadOnly(), data())
    assert [rest for rest, _ in recorder.rates] == pytest.approx([0.1 * 0.7 ** epoch for epoch in range(6)])
    assert [lr for _, lr in recorder.rates] == [pytest.approx(lr) if lr is not None else None for lr in backbone]


@pytest.mark.parametrize("train_bn", [True, False])
def test_backbone_finetuning_train_bn_decides_whether_batchnorm_joins_the_backbone_group(tmp_path, train_bn):
    model = HeadOnly()
    run = trainer(tmp_path, max_epochs=2, limit_val_batches=0,
                  callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1, train_bn=train_bn)])  # fmt: skip
    run.fit(model, data())
    batchnorm = set(model.backbone[1].parameters())
    added = run.optimizers[0].param_groups[1]["params"]
    assert set(model.backbone[0].parameters()) <= set(added)
    assert bool(batchnorm & set(added)) is train_bn
    # as in Lightning, freezing the backbone leaves its BatchNorm trainable either way
    fresh = HeadOnly()
    BackboneFinetuning(train_bn=train_bn).freeze_before_training(fresh)
    assert all(p.requires_grad for p in fresh.backbone[1].parameters())
    assert not any(p.requires_grad for p in fresh.backbone[0].parameters())


def test_base_finetuning_state_keeps_each_group_as_it_was_added(tmp_path):
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_lr=0.01)
    trainer(tmp_path, max_epochs=3, limit_val_batches=0, callbacks=[finetuning]).fit(HeadOnly(), data())
    groups = finetuning.state_dict()["internal_optimizer_metadata"][0]
    assert [group["params"] for group in groups] == [
        ["head.weight", "head.bias"], ["backbone.0.weight", "backbone.0.bias", "backbone.1.weight", "backbone.1.bias"]]
    assert [group["lr"] for group in groups] == [0.1, 0.01]  # the rates they started with, not today's
    assert finetuning.state_dict()["previous_backbone_lr"] == pytest.approx(min(0.02, 0.1 * 0.7 ** 2))


def test_base_finetuning_must_be_implemented_and_backbone_must_exist(tmp_path):
    class NoBackbone(LitModel):
        def __init__(self):
            super().__init__()
            del self.backbone
            self.body = nn.Linear(3, 8)

        def forward(self, x):
            return self.head(self.body(x))

    with pytest.raises(ConfigurationError, match="self.backbone"):
        trainer(tmp_path, max_epochs=1, callbacks=[BackboneFinetuning()]).fit(NoBackbone(), data())
    with pytest.raises(NotImplementedError, match="freeze_before_training"):
        trainer(tmp_path, max_epochs=1, callbacks=[BaseFinetuning()]).fit(LitModel(), data())


def test_str_of_a_datamodule_lists_its_loaders():
    class Data(DataModule):
        def train_dataloader(self):
            return data(16)

        def val_dataloader(self):
            return [data(8), data(4)]

        def test_dataloader(self):
            raise RuntimeError("not set up yet")

    lines = str(Data()).splitlines()
    assert lines == ["{Train dataloader: size=16}", "{Validation dataloader: 1. size=8 ; 2. size=4}",
                     "{Test dataloader: None}", "{Predict dataloader: None}"]  # fmt: skip


def test_rich_progress_bar_takes_lightnings_refresh_rate(tmp_path):
    from trainer.callbacks import RichProgressBar

    hidden = RichProgressBar(refresh_rate=0, leave=True)
    trainer(tmp_path, max_epochs=1, enable_progress_bar=True, callbacks=[hidden]).fit(LitModel(), data())
    assert hidden._display is None and hidden.leave


def test_lightnings_other_callback_arguments_are_taken(tmp_path):
    from trainer.callbacks import BatchSizeFinder, LearningRateFinder

    monitor = LearningRateMonitor(log_key_prefix="optim/")
    trainer(tmp_path, logger=CSVLogger(tmp_path), max_epochs=1, callbacks=[monitor]).fit(LitModel(), data())
    assert list(monitor.lrs) == ["optim/lr-SGD"]
    assert EarlyStopping(monitor="val_loss", log_rank_zero_only=True).log_rank_zero_only
    assert LearningRateFinder(weights_only=True).weights_only
    assert BatchSizeFinder(mode="binsearch", margin=0.05, max_memory_mb=1).margin == 0.05
    with pytest.raises(ConfigurationError, match="margin"):
        BatchSizeFinder(margin=1.5)


def test_finetuning_under_deepspeed_is_refused_as_lightning_refuses_it():
    pytest.importorskip("deepspeed")
    run = Trainer(accelerator="cpu", strategy="deepspeed", logger=False, enable_checkpointing=False)
    with pytest.raises(NotImplementedError, match="does not support running with the DeepSpeed strategy"):
        BackboneFinetuning().setup(run, LitModel(), stage="fit")
