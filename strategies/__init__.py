"""Strategies: where and how a module runs (devices, wrapping, collectives, precision, checkpoints).

At its root: the ``Strategy`` interface, the single-device and multi-process base strategies, the registry and
the connector (argument -> strategy); each capability is a sub-package (``data_parallel``, ``nd``, ``checkpoint``,
``launch``, ``precision``, ``speed``). This package never imports ``trainer``, ``callbacks`` or ``loggers``; it is
the bottom layer. The multi-process strategies and cluster environments are imported when their name is first used
(``from trainer.strategies import DDPStrategy``), so ``import trainer`` does not pay for torch.distributed wrappers
a single-device run never touches.
"""
from __future__ import annotations

if __name__ == "strategies":  # the short name, from a source checkout: one module tree, under trainer.strategies
    from trainer._source_layout import alias_short_name

    alias_short_name(__name__)

import importlib
from typing import TYPE_CHECKING, Any

from trainer.strategies.errors import ConfigurationError, HangError, RankFailedError
from trainer.strategies.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from trainer.strategies.registry import register_strategy, strategy_names
from trainer.strategies.single_device import SingleDeviceStrategy
from trainer.strategies.strategy import Strategy

if TYPE_CHECKING:  # pragma: no cover  (for type checkers; at run time __getattr__ imports on use)
    from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, CheckpointIO  # noqa: F401
    from trainer.strategies.data_parallel.ddp import DDPStrategy  # noqa: F401
    from trainer.strategies.data_parallel.deepspeed import DeepSpeedStrategy  # noqa: F401
    from trainer.strategies.data_parallel.dp import DataParallelStrategy  # noqa: F401
    from trainer.strategies.launch.environments import LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment  # noqa: F401
    from trainer.strategies.data_parallel.fsdp import FSDPStrategy  # noqa: F401
    from trainer.strategies.data_parallel.fault_tolerant import FaultTolerantStrategy  # noqa: F401
    from trainer.strategies.data_parallel.fault_tolerant_hsdp import FaultTolerantHSDPStrategy  # noqa: F401
    from trainer.strategies.nd.model_parallel import ModelParallelStrategy  # noqa: F401
    from trainer.strategies.nd.nd_parallel import NDParallelStrategy  # noqa: F401
    from trainer.strategies.parallel import ParallelStrategy  # noqa: F401
    from trainer.strategies.data_parallel.zero import Zero1Strategy, Zero2Strategy, ZeroStrategy  # noqa: F401

_LAZY = {
    "CheckpointError": "trainer.strategies.checkpoint.checkpoint_io",
    "CheckpointIO": "trainer.strategies.checkpoint.checkpoint_io",
    "DDPStrategy": "trainer.strategies.data_parallel.ddp",
    "DeepSpeedStrategy": "trainer.strategies.data_parallel.deepspeed",
    "DataParallelStrategy": "trainer.strategies.data_parallel.dp",
    "FSDPStrategy": "trainer.strategies.data_parallel.fsdp",
    "FaultTolerantHSDPStrategy": "trainer.strategies.data_parallel.fault_tolerant_hsdp",
    "FaultTolerantStrategy": "trainer.strategies.data_parallel.fault_tolerant",
    "LocalEnvironment": "trainer.strategies.launch.environments",
    "ModelParallelStrategy": "trainer.strategies.nd.model_parallel",
    "NDParallelStrategy": "trainer.strategies.nd.nd_parallel",
    "ParallelStrategy": "trainer.strategies.parallel",
    "SLURMEnvironment": "trainer.strategies.launch.environments",
    "TorchElasticEnvironment": "trainer.strategies.launch.environments",
    "Zero1Strategy": "trainer.strategies.data_parallel.zero",
    "Zero2Strategy": "trainer.strategies.data_parallel.zero",
    "ZeroStrategy": "trainer.strategies.data_parallel.zero",
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
    raise AttributeError(f"module 'trainer.strategies' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
