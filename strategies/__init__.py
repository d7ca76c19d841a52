"""Strategies: where and how a module runs (devices, wrapping, collectives, precision, checkpoints).

This package never imports ``trainer``, ``callbacks`` or ``loggers``; it is the bottom layer.
"""
from strategies.ddp import DDPStrategy
from strategies.dp import DataParallelStrategy
from strategies.environments import LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment
from strategies.errors import ConfigurationError, RankFailedError
from strategies.fsdp import FSDPStrategy
from strategies.model_parallel import ModelParallelStrategy
from strategies.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from strategies.registry import register_strategy, strategy_names
from strategies.single_device import SingleDeviceStrategy
from strategies.strategy import Strategy
from strategies.zero import Zero1Strategy, Zero2Strategy, ZeroStrategy

__all__ = [
    "ConfigurationError",
    "DDPStrategy",
    "DataParallelStrategy",
    "DoublePrecision",
    "FSDPStrategy",
    "HalfPrecision",
    "LocalEnvironment",
    "MixedPrecision",
    "ModelParallelStrategy",
    "Precision",
    "RankFailedError",
    "SLURMEnvironment",
    "SingleDeviceStrategy",
    "Strategy",
    "TorchElasticEnvironment",
    "Zero1Strategy",
    "Zero2Strategy",
    "ZeroStrategy",
    "register_strategy",
    "strategy_names",
]
