"""Strategies: where and how a module runs (devices, wrapping, collectives, precision, checkpoints).

This package never imports ``trainer``, ``callbacks`` or ``loggers``; it is the bottom layer. The
multi-process strategies and cluster environments are imported when their name is first used
(``from strategies import DDPStrategy``), so ``import trainer`` does not pay for torch.distributed wrappers
a single-device run never touches.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from strategies.errors import ConfigurationError, HangError, RankFailedError
from strategies.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from strategies.registry import register_strategy, strategy_names
from strategies.single_device import SingleDeviceStrategy
from strategies.strategy import Strategy

if TYPE_CHECKING:  # pragma: no cover  (for type checkers; at run time __getattr__ imports on use)
    from strategies.checkpoint_io import CheckpointError, CheckpointIO  # noqa: F401
    from strategies.ddp import DDPStrategy  # noqa: F401
    from strategies.deepspeed import DeepSpeedStrategy  # noqa: F401
    from strategies.dp import DataParallelStrategy  # noqa: F401
    from strategies.environments import LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment  # noqa: F401
    from strategies.fsdp import FSDPStrategy  # noqa: F401
    from strategies.model_parallel import ModelParallelStrategy  # noqa: F401
    from strategies.nd_parallel import NDParallelStrategy  # noqa: F401
    from strategies.zero import Zero1Strategy, Zero2Strategy, ZeroStrategy  # noqa: F401

_LAZY = {
    "CheckpointError": "strategies.checkpoint_io",
    "CheckpointIO": "strategies.checkpoint_io",
    "DDPStrategy": "strategies.ddp",
    "DeepSpeedStrategy": "strategies.deepspeed",
    "DataParallelStrategy": "strategies.dp",
    "FSDPStrategy": "strategies.fsdp",
    "LocalEnvironment": "strategies.environments",
    "ModelParallelStrategy": "strategies.model_parallel",
    "NDParallelStrategy": "strategies.nd_parallel",
    "SLURMEnvironment": "strategies.environments",
    "TorchElasticEnvironment": "strategies.environments",
    "Zero1Strategy": "strategies.zero",
    "Zero2Strategy": "strategies.zero",
    "ZeroStrategy": "strategies.zero",
}

__all__ = [
    "ConfigurationError",
    "DoublePrecision",
    "HalfPrecision",
    "HangError",
    "MixedPrecision",
    "Precision",
    "RankFailedError",
    "SingleDeviceStrategy",
    "Strategy",
    "register_strategy",
    "strategy_names",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
