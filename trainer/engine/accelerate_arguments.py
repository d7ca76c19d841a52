"""Accelerate's ``Accelerator(...)`` arguments, read into the Engine's own: ``mixed_precision`` → ``precision``,
``cpu`` → ``accelerator``, ``gradient_accumulation_steps`` → ``accumulate_grad_batches``, ``log_with`` →
``loggers``, ``project_config`` → ``project_dir``, and the ``kwargs_handlers`` applied to the strategy and precision
plugin. Everything is checked here, once, when the Engine is built.

Precedence is Accelerate's: an argument the script gives wins; a script's default (``mixed_precision=None``,
``cpu=False``, ``gradient_accumulation_steps=1``) leaves what the launcher set (``trainer run --config``,
see :func:`trainer.config.launch_defaults.launch_aliases`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from trainer.engine.options import (
    AutocastKwargs, DataLoaderConfiguration, DDPCommunicationHookType, DistributedDataParallelKwargs,
    DistributedType, GradientAccumulationPlugin, GradScalerKwargs, InitProcessGroupKwargs, KwargsHandler,
    ProfileKwargs, ProjectConfiguration, precision_from_mixed_precision,
)
from trainer.strategies.errors import ConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    from trainer.strategies.strategy import Strategy

_HANDLERS = (DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs, ProfileKwargs, AutocastKwargs)


@dataclass
class AccelerateArguments:
    """The Engine's arguments after Accelerate's names were read, and the handlers to apply."""

    accelerator: Any
    precision: Any
    accumulate_grad_batches: Any
    loggers: Any
    project_dir: Any
    project_config: ProjectConfiguration
    dataloader_config: DataLoaderConfiguration
    handlers: dict[type, KwargsHandler] = field(default_factory=dict)

    @classmethod
    def read(cls, engine: Any, *, accelerator: Any, precision: Any, accumulate_grad_batches: Any, loggers: Any,
             project_dir: Any, mixed_precision: Any, cpu: Any, gradient_accumulation_steps: Any, log_with: Any,
             project_config: Any, kwargs_handlers: Any, dataloader_config: Any, split_batches: Any,
             gradient_accumulation_plugin: Any, device_placement: Any, rng_types: Any) -> "AccelerateArguments":  # fmt: skip
        """Check Accelerate's arguments and fold them into the Engine's; ``engine`` decides which data split
        (its ``numbers``) the dataloader settings may ask for."""
        if mixed_precision is None and os.environ.get("ACCELERATE_MIXED_PRECISION") and precision == "32-true":
            mixed_precision = os.environ["ACCELERATE_MIXED_PRECISION"]  # set by notebook_launcher
        if mixed_precision is not None:
            mapped = precision_from_mixed_precision(mixed_precision)
            if precision not in ("32-true", mapped):
                raise ConfigurationError(f"mixed_precision={mixed_precision!r} and precision={precision!r} disagree: "
                                         "pass one of them.")  # fmt: skip
            precision = mapped
        if not isinstance(cpu, bool):
            raise ConfigurationError(f"cpu={cpu!r} must be True or False.")
        if cpu or _env_true("ACCELERATE_USE_CPU"):
            if accelerator not in ("auto", "cpu"):
                raise ConfigurationError(f"cpu=True and accelerator={accelerator!r} disagree: pass one of them.")
            accelerator = "cpu"
        steps = gradient_accumulation_steps
        if gradient_accumulation_plugin is not None:
            steps = _plugin_steps(gradient_accumulation_plugin, steps)
        if steps is not None and steps != 1:
            if accumulate_grad_batches not in (1, steps):
                raise ConfigurationError(f"gradient_accumulation_steps={steps!r} and accumulate_grad_batches="
                                         f"{accumulate_grad_batches!r} disagree: pass one of them.")  # fmt: skip
            accumulate_grad_batches = steps
        if log_with is not None:
            if loggers is not None:
                raise ConfigurationError("log_with= and loggers= both name the trackers: pass one of them.")
            loggers = _trackers(log_with)
        if project_config is None:
            project_config = ProjectConfiguration(project_dir=None if project_dir is None else os.fspath(project_dir))
        elif not isinstance(project_config, ProjectConfiguration):
            raise ConfigurationError(f"project_config must be a ProjectConfiguration, got {type(project_config).__name__}.")
        elif project_dir is not None and project_config.project_dir not in (None, os.fspath(project_dir)):
            raise ConfigurationError("project_dir= and project_config.project_dir disagree: pass one of them.")
        if project_dir is None:
            project_dir = project_config.project_dir
        config = _dataloader_config(engine, dataloader_config, split_batches)
        if device_placement is not True:
            raise ConfigurationError("device_placement=False is not supported: prepared modules and batches are "
                                     "always put on engine.device. Leave it out.")  # fmt: skip
        if rng_types is not None and list(rng_types) not in ([], ["generator"]):
            raise ConfigurationError(f"rng_types={rng_types!r} is not supported: prepared dataloaders share their "
                                     "sampler's generator across processes (Accelerate's default). Leave it out.")  # fmt: skip
        return cls(accelerator, precision, accumulate_grad_batches, loggers, project_dir, project_config, config,
                   _handlers(kwargs_handlers))  # fmt: skip

    def handler(self, kind: type) -> Optional[Any]:
        """The handler of class ``kind`` the script gave, if any."""
        return self.handlers.get(kind)

    def apply_before_launch(self, strategy: "Strategy") -> None:
        """Settings the processes must have before they join: DDP's arguments, the process group's."""
        ddp = self.handler(DistributedDataParallelKwargs)
        if ddp is not None and hasattr(strategy, "ddp_kwargs"):
            strategy.ddp_kwargs.update({k: v for k, v in ddp.to_kwargs().items()
                                        if k not in ("comm_hook", "comm_wrapper", "comm_state_option")})  # fmt: skip
        group = self.handler(InitProcessGroupKwargs)
        if group is not None and hasattr(strategy, "timeout"):
            if group.timeout is not None:
                strategy.timeout = group.timeout
            if "backend" in group.to_kwargs() and group.backend is not None:
                strategy.process_group_backend = group.backend
            if group.init_method is not None:
                raise ConfigurationError("InitProcessGroupKwargs(init_method=...) is not supported: the processes meet "
                                         "where the launcher says (MASTER_ADDR/MASTER_PORT). Leave it out.")  # fmt: skip

    def apply_after_setup(self, strategy: "Strategy") -> None:
        """Settings that need the device: the fp16 gradient scaler's."""
        scaler = self.handler(GradScalerKwargs)
        precision = strategy.precision
        if scaler is None or getattr(precision, "scaler", None) is None:
            return
        import torch

        precision.scaler = torch.amp.GradScaler(precision.device_type, **scaler.to_kwargs())

    def register_comm_hook(self, runner: Any) -> None:
        """``DistributedDataParallelKwargs(comm_hook=...)`` on a module DDP wrapped."""
        ddp = self.handler(DistributedDataParallelKwargs)
        if ddp is None or DDPCommunicationHookType(ddp.comm_hook) is DDPCommunicationHookType.NO:
            return
        from torch.nn.parallel import DistributedDataParallel
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if not isinstance(runner, DistributedDataParallel):
            return
        kind, wrapper = DDPCommunicationHookType(ddp.comm_hook), DDPCommunicationHookType(ddp.comm_wrapper)
        hooks = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
                 DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
                 DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
                 DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook}  # fmt: skip
        hook = hooks[kind]
        if kind in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state: Any = powerSGD_hook.PowerSGDState(process_group=None, **ddp.comm_state_option)
        else:
            state = None
        if wrapper is DDPCommunicationHookType.FP16:
            hook = default_hooks.fp16_compress_wrapper(hook)
        elif wrapper is DDPCommunicationHookType.BF16:
            hook = default_hooks.bf16_compress_wrapper(hook)
        runner.register_comm_hook(state, hook)


def distributed_type(strategy: "Strategy") -> DistributedType:
    """How ``strategy`` runs, as Accelerate's ``DistributedType``."""
    name = getattr(strategy, "strategy_name", "")
    if "deepspeed" in name:
        return DistributedType.DEEPSPEED
    if "fsdp" in name or name.startswith("zero"):
        return DistributedType.FSDP
    if strategy.world_size == 1:
        return DistributedType.NO
    device = strategy.root_device.type
    return {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU,
            "hpu": DistributedType.MULTI_HPU}.get(device, DistributedType.MULTI_CPU)  # fmt: skip


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _plugin_steps(plugin: Any, steps: Any) -> Any:
    if not isinstance(plugin, GradientAccumulationPlugin):
        raise ConfigurationError(f"gradient_accumulation_plugin must be a GradientAccumulationPlugin, got "
                                 f"{type(plugin).__name__}.")  # fmt: skip
    if steps not in (None, 1):
        raise ConfigurationError("gradient_accumulation_steps= and gradient_accumulation_plugin= both set the steps: "
                                 "pass the plugin only.")  # fmt: skip
    if not plugin.sync_with_dataloader or plugin.sync_each_batch:
        raise ConfigurationError("GradientAccumulationPlugin(sync_with_dataloader=False or sync_each_batch=True) is "
                                 "not supported: windows end every num_steps micro-batches and at each epoch's end.")  # fmt: skip
    return plugin.num_steps


def _trackers(log_with: Any) -> Any:
    """Accelerate's ``log_with`` as ``loggers``: "all" is every tracker available here (TensorBoard, else CSV)."""
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    converted = []
    for item in items:
        name = getattr(item, "value", item)  # LoggerType members
        if isinstance(name, str) and name.lower() == "all":
            converted.append(True)
        else:
            converted.append(name)
    return converted


def _handlers(kwargs_handlers: Any) -> dict[type, KwargsHandler]:
    found: dict[type, KwargsHandler] = {}
    for handler in kwargs_handlers or ():
        kind = next((k for k in _HANDLERS if isinstance(handler, k)), None)
        if kind is None:
            raise ConfigurationError(
                f"kwargs_handlers got a {type(handler).__name__}; the Engine takes "
                f"{', '.join(k.__name__ for k in _HANDLERS)} (from trainer.accelerate.utils)."
            )
        if kind in found:
            raise ConfigurationError(f"kwargs_handlers has two {kind.__name__}; pass one.")
        found[kind] = handler
    return found


def _dataloader_config(engine: Any, config: Any, split_batches: Any) -> DataLoaderConfiguration:
    if config is None:
        config = DataLoaderConfiguration()
    elif not isinstance(config, DataLoaderConfiguration):
        raise ConfigurationError(f"dataloader_config must be a DataLoaderConfiguration, got {type(config).__name__}.")
    if split_batches is not None:
        if split_batches != config.split_batches and config.split_batches:
            raise ConfigurationError("split_batches= and dataloader_config.split_batches disagree: pass one of them.")
        config.split_batches = bool(split_batches)
    config.check()
    if engine.numbers != "accelerate" and (config.split_batches or not config.even_batches):
        raise ConfigurationError(
            "split_batches and even_batches=False describe Accelerate's data split (whole batches dealt to the "
            "processes); the Engine splits samples as the Trainer does. Use trainer.accelerate.Accelerator, "
            "which splits as Accelerate does."
        )
    return config
