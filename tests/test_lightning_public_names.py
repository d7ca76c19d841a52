"""Lightning's public names at the paths the documented rename gives them (``pytorch_lightning.X`` →
``trainer.X``), used the way a ported project uses them."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.core import LightningDataModule, LightningModule
from trainer.core.optimizer import LightningOptimizer
from trainer.plugins import LayerSync, MixedPrecision, Precision, TorchCheckpointIO, TorchSyncBatchNorm
from trainer.plugins.environments import LightningEnvironment
from trainer.plugins.precision import DoublePrecision
from trainer.strategies import ConfigurationError
from trainer.utilities import AttributeDict, grad_norm, move_data_to_device, rank_zero_only
from trainer.utilities.exceptions import MisconfigurationException
from trainer.utilities.types import STEP_OUTPUT, OptimizerLRScheduler


def data(n: int = 8) -> DataLoader:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class GANLike(LightningModule):
    """Annotated the way Lightning's examples annotate: STEP_OUTPUT, OptimizerLRScheduler, LightningOptimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = nn.Linear(3, 1)
        self.seen_types: list[type] = []

    def training_step(self, batch, batch_idx) -> STEP_OUTPUT:
        optimizer = self.optimizers()
        assert isinstance(optimizer, LightningOptimizer)
        loss = F.mse_loss(self.layer(batch[0]), batch[1])
        self.manual_backward(loss)
        self.log_dict(grad_norm(self.layer, norm_type=2))
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def configure_optimizers(self) -> OptimizerLRScheduler:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_module_written_against_lightnings_core_and_types_trains():
    assert LightningModule is TrainModule
    model = GANLike()
    trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, data())
    assert trainer.global_step == 2
    assert {"grad_2.0_norm/weight", "grad_2.0_norm/bias", "grad_2.0_norm_total"} <= set(trainer.callback_metrics)
    assert issubclass(LightningDataModule, object) and LightningDataModule.__name__ == "DataModule"


def test_misconfiguration_exception_is_our_configuration_error():
    assert MisconfigurationException is ConfigurationError
    with pytest.raises(MisconfigurationException):
        Trainer(max_epochs="ten")


def test_rank_zero_only_and_the_utilities():
    calls = []

    @rank_zero_only
    def note(value):
        calls.append(value)

    note(1)
    assert calls == [1]  # one process: rank 0
    hparams = AttributeDict(lr=0.1)
    assert hparams.lr == 0.1
    moved = move_data_to_device({"x": torch.ones(2), "n": 3}, torch.device("cpu"))
    assert moved["n"] == 3 and moved["x"].device.type == "cpu"
    with pytest.raises(ConfigurationError, match="norm_type"):
        grad_norm(nn.Linear(1, 1), norm_type=0)


def test_plugins_at_lightnings_paths_are_ours_and_the_trainer_takes_them(tmp_path):
    assert issubclass(MixedPrecision, Precision) and issubclass(DoublePrecision, Precision)
    io_plugin = TorchCheckpointIO()
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      plugins=[io_plugin, LightningEnvironment(), DoublePrecision()])  # fmt: skip
    assert trainer.precision == "64-true" and trainer.strategy.checkpoint_io is io_plugin
    trainer.fit(GANLike(), data())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    assert io_plugin.load_checkpoint(tmp_path / "a.ckpt")["global_step"] == 1


def test_torch_sync_batchnorm_converts_and_reverts_and_is_a_plugin():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.BatchNorm1d(4)))
    model[1].running_mean.fill_(2.0)
    synced = TorchSyncBatchNorm().apply(model)
    assert isinstance(synced[1], nn.SyncBatchNorm) and isinstance(synced[2][0], nn.SyncBatchNorm)
    reverted = TorchSyncBatchNorm().revert(synced)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in reverted.modules())
    assert torch.equal(reverted[1].running_mean, torch.full((4,), 2.0))
    reverted.train()(torch.randn(5, 3))  # a working BatchNorm again

    one = Trainer(accelerator="cpu", plugins=[TorchSyncBatchNorm()], logger=False)
    assert one.sync_batchnorm  # the plugin is sync_batchnorm=True
    with pytest.raises(ConfigurationError, match="sync_batchnorm=True and a LayerSync plugin"):
        Trainer(accelerator="cpu", sync_batchnorm=True, plugins=[TorchSyncBatchNorm()], logger=False)
    with pytest.raises(ConfigurationError, match="GPUs only"):  # as sync_batchnorm=True: no CPU kernel
        Trainer(accelerator="cpu", devices=2, strategy="ddp", plugins=[TorchSyncBatchNorm()], logger=False)
    assert issubclass(TorchSyncBatchNorm, LayerSync)


# ---------------------------------------------------------------------------------------------- the docs table
#: Lightning 2.6's public names (``lightning.pytorch.<path>``) a ported project imports.
LIGHTNING_PUBLIC_NAMES = (
    "Trainer", "LightningModule", "LightningDataModule", "Callback", "seed_everything",
    "core.LightningModule", "core.LightningDataModule", "core.optimizer.LightningOptimizer", "cli.LightningCLI",
    "core.module.LightningModule", "core.datamodule.LightningDataModule", "trainer.trainer.Trainer",
    "trainer.states.TrainerFn", "trainer.states.RunningStage", "trainer.states.TrainerStatus",
    "trainer.states.TrainerState", "utilities.combined_loader.CombinedLoader", "utilities.model_helpers.is_overridden",
    "tuner.Tuner",
    *(f"callbacks.{name}" for name in (
        "BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback", "Checkpoint",
        "DeviceStatsMonitor", "EarlyStopping", "GradientAccumulationScheduler", "LambdaCallback", "LearningRateFinder",
        "LearningRateMonitor", "ModelCheckpoint", "ModelPruning", "ModelSummary", "OnExceptionCheckpoint",
        "ProgressBar", "RichModelSummary", "RichProgressBar", "StochasticWeightAveraging", "SpikeDetection",
        "ThroughputMonitor", "Timer", "TQDMProgressBar", "EMAWeightAveraging", "WeightAveraging")),
    *(f"loggers.{name}" for name in (
        "Logger", "CSVLogger", "TensorBoardLogger", "MLFlowLogger", "WandbLogger", "CometLogger", "LitLogger")),
    *(f"plugins.{name}" for name in (
        "Precision", "MixedPrecision", "DoublePrecision", "HalfPrecision", "FSDPPrecision", "DeepSpeedPrecision",
        "BitsandbytesPrecision", "TransformerEnginePrecision", "XLAPrecision", "CheckpointIO", "TorchCheckpointIO",
        "AsyncCheckpointIO", "XLACheckpointIO", "LayerSync", "TorchSyncBatchNorm")),
    *(f"profilers.{name}" for name in (
        "Profiler", "SimpleProfiler", "PyTorchProfiler", "AdvancedProfiler", "PassThroughProfiler", "XLAProfiler")),
    *(f"strategies.{name}" for name in (
        "Strategy", "ParallelStrategy", "SingleDeviceStrategy", "DDPStrategy", "FSDPStrategy", "DeepSpeedStrategy",
        "ModelParallelStrategy")),
    *(f"accelerators.{name}" for name in (
        "Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator", "XLAAccelerator",
        "find_usable_cuda_devices")),
    *(f"utilities.{name}" for name in (
        "AttributeDict", "CombinedLoader", "grad_norm", "move_data_to_device", "rank_zero_only", "rank_zero_info",
        "rank_zero_warn", "rank_zero_deprecation", "measure_flops", "disable_possible_user_warnings",
        "find_shared_parameters", "set_shared_parameters", "GradClipAlgorithmType", "LightningEnum", "is_picklable",
        "is_shared_filesystem", "suggested_max_num_workers")),
    "utilities.exceptions.MisconfigurationException", "utilities.warnings.PossibleUserWarning",
    "utilities.data.has_len_all_ranks", "utilities.data.has_iterable_dataset", "utilities.types.STEP_OUTPUT",
    "utilities.types.OptimizerLRScheduler", "utilities.types.TRAIN_DATALOADERS", "utilities.types.EVAL_DATALOADERS",
    "utilities.types.LRSchedulerTypeUnion", "utilities.types.LRSchedulerConfig",
    *(f"demos.boring_classes.{name}" for name in (
        "BoringModel", "BoringDataModule", "BoringDataModuleNoLen", "IterableBoringDataModule",
        "ManualOptimBoringModel", "DemoModel", "Net", "RandomDataset", "RandomDictDataset", "RandomIterableDataset",
        "RandomIterableDatasetWithLen")),
)  # fmt: skip


def resolve(dotted: str) -> bool:
    """Whether ``dotted`` (``trainer.callbacks.ModelCheckpoint``) imports: the longest module prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        try:
            for name in parts[end:]:
                value = getattr(value, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_lightning_public_name_is_importable_at_its_renamed_path_or_listed_with_a_reason():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "migrating_from_lightning.md").read_text()
    section = text.split("## Public names\n", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = (cells[1], cells[2])
    assert sorted(table) == sorted(LIGHTNING_PUBLIC_NAMES), "the docs table must list exactly Lightning's public names"
    problems = []
    for name, (status, notes) in table.items():
        here = resolve(f"trainer.{name}")
        if status in ("same", "partly"):
            if not here:
                problems.append(f"{name}: the table says {status!r} but trainer.{name} does not import")
        elif status == "renamed":
            target = re.search(r"`(trainer\.[\w.]+)`", notes)
            if target is None or not resolve(target.group(1)):
                problems.append(f"{name}: renamed, but the notes name no importable trainer.* path")
        elif status == "not supported":
            if here or len(notes) < 40:
                problems.append(f"{name}: not supported, yet importable, or without a reason and an alternative")
        else:
            problems.append(f"{name}: unknown status {status!r}")
    assert not problems, problems
