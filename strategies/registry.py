"""Strategy names → classes, imported lazily so ``import trainer`` stays cheap."""
from __future__ import annotations

import importlib
from typing import Any

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.strategy import Strategy

# name: (module, class, constructor kwargs, what to install when missing)
_REGISTRY: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "single_device": ("trainer.strategies.single_device", "SingleDeviceStrategy", {}, ""),
    "dp": ("trainer.strategies.data_parallel.dp", "DataParallelStrategy", {}, ""),
    "ddp": ("trainer.strategies.data_parallel.ddp", "DDPStrategy", {"start_method": "popen"}, ""),
    "ddp_spawn": ("trainer.strategies.data_parallel.ddp", "DDPStrategy", {"start_method": "spawn"}, ""),
    "zero1": ("trainer.strategies.data_parallel.zero", "Zero1Strategy", {}, ""),
    "zero2": ("trainer.strategies.data_parallel.zero", "Zero2Strategy", {}, ""),
    "fsdp": ("trainer.strategies.data_parallel.fsdp", "FSDPStrategy", {}, ""),
    "model_parallel": ("trainer.strategies.nd.model_parallel", "ModelParallelStrategy", {}, ""),
    "nd_parallel": ("trainer.strategies.nd.nd_parallel", "NDParallelStrategy", {}, ""),
    "deepspeed": ("trainer.strategies.data_parallel.deepspeed", "DeepSpeedStrategy", {}, "deepspeed"),
    "ft_ddp": ("trainer.strategies.data_parallel.fault_tolerant", "FaultTolerantStrategy", {}, "torchft-nightly"),
    "ft_hsdp": ("trainer.strategies.data_parallel.fault_tolerant_hsdp", "FaultTolerantHSDPStrategy", {},
                "torchft-nightly"),
    # Lightning's spellings of common set-ups
    "ddp_fork": ("trainer.strategies.data_parallel.ddp", "DDPStrategy", {"start_method": "fork"}, ""),
    "ddp_notebook": ("trainer.strategies.data_parallel.ddp", "DDPStrategy", {"start_method": "fork"}, ""),
    # Lightning's find_unused_parameters spellings, for every start method
    **{f"{name}_find_unused_parameters_{str(flag).lower()}": (
        "trainer.strategies.data_parallel.ddp", "DDPStrategy", {"start_method": method, "find_unused_parameters": flag}, "")
       for name, method in (("ddp", "popen"), ("ddp_spawn", "spawn"), ("ddp_fork", "fork"), ("ddp_notebook", "fork"))
       for flag in (False, True)},
    "deepspeed_stage_1": ("trainer.strategies.data_parallel.deepspeed", "DeepSpeedStrategy", {"stage": 1}, "deepspeed"),
    "deepspeed_stage_2": ("trainer.strategies.data_parallel.deepspeed", "DeepSpeedStrategy", {"stage": 2}, "deepspeed"),
    "deepspeed_stage_2_offload": ("trainer.strategies.data_parallel.deepspeed", "DeepSpeedStrategy", {"stage": 2, "offload_optimizer": True},
                                  "deepspeed"),
    "deepspeed_stage_3": ("trainer.strategies.data_parallel.deepspeed", "DeepSpeedStrategy", {"stage": 3}, "deepspeed"),
    "deepspeed_stage_3_offload": ("trainer.strategies.data_parallel.deepspeed", "DeepSpeedStrategy",
                                  {"stage": 3, "offload_optimizer": True, "offload_parameters": True}, "deepspeed"),
}


def register_strategy(name: str, module: str, cls: str, requires: str = "", **kwargs: Any) -> None:
    """Make ``strategy=name`` build ``module.cls(**kwargs)``; ``requires`` names a missing optional package."""
    _REGISTRY[name] = (module, cls, kwargs, requires)


def strategy_names() -> list[str]:
    """Every name ``strategy=`` accepts besides ``"auto"``."""
    return list(_REGISTRY)


def create_strategy(name: str) -> Strategy:
    """Instantiate the strategy registered as ``name``, or raise listing the valid names."""
    key = name.lower() if isinstance(name, str) else name
    if key not in _REGISTRY:
        valid = ", ".join(repr(n) for n in ["auto", *_REGISTRY])
        raise ConfigurationError(
            f"strategy={name!r} is not known. Valid values: {valid}, or a Strategy instance."
        )
    module_name, cls_name, kwargs, requires = _REGISTRY[key]
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        hint = f" Install it with `pip install {requires}`." if requires else ""
        raise ConfigurationError(f"strategy={name!r} is unavailable: {err}.{hint}") from err
    return getattr(module, cls_name)(**kwargs)
