"""``Trainer(plugins=...)``: Lightning's way of handing the Trainer a precision plugin, a cluster environment, a
checkpoint-IO object or a layer sync. Each is routed to where it belongs here: the precision plugin is the
``precision`` argument, the cluster environment the strategy's, the checkpoint IO the strategy's single-file
writer, a layer sync (``TorchSyncBatchNorm``) converts the module's layers as ``sync_batchnorm=True`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trainer.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from trainer.strategies.checkpoint.checkpoint_io import CheckpointIO
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision import Precision, canonical_precision


@dataclass
class PluginSettings:
    """What ``plugins=`` held, sorted by kind (each kind at most once)."""

    precision: Optional[Precision] = None
    cluster_environment: Any = None
    checkpoint_io: Optional[CheckpointIO] = None
    layer_sync: Optional[LayerSync] = None


def _is_cluster_environment(plugin: Any) -> bool:
    if not all(callable(getattr(plugin, name, None)) for name in ("world_size", "global_rank", "local_rank")):
        return False
    from trainer.strategies.launch.environments import ClusterEnvironment

    return isinstance(plugin, ClusterEnvironment)


def _is_checkpoint_io(plugin: Any) -> bool:
    return isinstance(plugin, CheckpointIO) or all(
        callable(getattr(plugin, name, None)) for name in ("save_checkpoint", "load_checkpoint", "remove_checkpoint")
    )


def sort_plugins(plugins: Any, precision: Any) -> PluginSettings:
    """Check ``plugins`` (one object or a list) and sort them; a precision plugin conflicts with a ``precision``
    argument other than the default."""
    if plugins is None:
        return PluginSettings()
    items = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    settings = PluginSettings()
    for plugin in items:
        if isinstance(plugin, Precision):
            kind = "precision"
        elif isinstance(plugin, LayerSync):
            kind = "layer_sync"
        elif _is_cluster_environment(plugin):
            kind = "cluster_environment"
        elif _is_checkpoint_io(plugin):
            kind = "checkpoint_io"
        else:
            raise ConfigurationError(
                f"Found invalid type for plugin {plugin}. plugins: {plugin!r} is not a plugin the Trainer knows. Pass a trainer.strategies.Precision (e.g. "
                "MixedPrecision('bf16-mixed')), a cluster environment (trainer.strategies.launch.environments.ClusterEnvironment), "
                "a checkpoint IO (trainer.strategies.checkpoint.checkpoint_io.CheckpointIO) or a layer sync "
                "(trainer.plugins.TorchSyncBatchNorm)."
            )
        if getattr(settings, kind) is not None:
            raise ConfigurationError(f"Received multiple values for {kind} flags in `plugins`. Expected one value for "
                                     f"each type at most: more than one {kind.replace('_', ' ')} plugin was given; "
                                     "pass one.")  # fmt: skip
        setattr(settings, kind, plugin)
    if settings.precision is not None and not isinstance(precision, Precision) and canonical_precision(precision) != "32-true":
        raise ConfigurationError(
            f"Received both `precision={precision}` and `plugins={settings.precision}`. Choose one: Trainer got "
            f"precision={precision!r} and a precision plugin in plugins=; pass only one of them."
        )
    return settings


def apply_to_strategy(strategy: Any, settings: PluginSettings) -> None:
    """Give the built strategy the checkpoint IO plugin (strategies that write folders cannot use one)."""
    if settings.checkpoint_io is None:
        return
    writes_folders = strategy.strategy_name == "deepspeed" or getattr(strategy, "state_dict_type", "full") == "sharded"
    if writes_folders:
        raise ConfigurationError(
            f"plugins: a checkpoint IO writes single-file checkpoints, but strategy {strategy.strategy_name!r} writes "
            "sharded checkpoint folders. Use state_dict_type='full' (FSDP/ZeRO) or drop the checkpoint IO plugin."
        )
    strategy.checkpoint_io = settings.checkpoint_io


def layer_sync_of(sync_batchnorm: bool, settings: PluginSettings) -> Optional[LayerSync]:
    """The layer sync to apply: ``TorchSyncBatchNorm`` for ``sync_batchnorm=True``, or the one in ``plugins=``."""
    if settings.layer_sync is not None:
        if sync_batchnorm:
            raise ConfigurationError(
                f"You set `Trainer(sync_batchnorm=True)` and provided a `{type(settings.layer_sync).__name__}` plugin, "
                "but this is not allowed. Choose one or the other: Trainer got sync_batchnorm=True and a LayerSync "
                "plugin in plugins=; pass only one of them."
            )
        return settings.layer_sync
    return TorchSyncBatchNorm() if sync_batchnorm else None


def check_sync_batchnorm(enabled: Any, strategy: Any) -> None:
    """``sync_batchnorm=True`` needs GPUs when several processes train: torch's ``SyncBatchNorm`` has no CPU kernel."""
    if isinstance(enabled, LayerSync):
        enabled = isinstance(enabled, TorchSyncBatchNorm)
    if enabled and strategy.is_distributed and strategy.root_device.type == "cpu":
        raise ConfigurationError(
            "sync_batchnorm=True: torch.nn.SyncBatchNorm synchronises statistics on GPUs only, and these processes "
            "run on the CPU. Drop sync_batchnorm, or train on GPUs (accelerator='gpu')."
        )


def sync_batchnorm_layers(module: Any, strategy: Any, layer_sync: Optional[LayerSync] = None) -> None:
    """Replace the module's BatchNorm layers by ``torch.nn.SyncBatchNorm`` (or apply ``layer_sync``), in place,
    before a distributed strategy wraps it; one process has nothing to synchronise and keeps them."""
    if not strategy.is_distributed:
        return
    layer_sync = layer_sync or TorchSyncBatchNorm()
    for name, child in list(module.named_children()):
        converted = layer_sync.apply(child)
        if converted is not child:
            setattr(module, name, converted)
