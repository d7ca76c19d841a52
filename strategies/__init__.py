"""Strategies: where and how a module runs (devices, wrapping, collectives, precision, checkpoints).

This package never imports ``trainer``, ``callbacks`` or ``loggers``; it is the bottom layer.
"""
from strategies.errors import ConfigurationError
from strategies.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from strategies.registry import register_strategy, strategy_names
from strategies.single_device import SingleDeviceStrategy
from strategies.strategy import Strategy

__all__ = [
    "ConfigurationError",
    "DoublePrecision",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "SingleDeviceStrategy",
    "Strategy",
    "register_strategy",
    "strategy_names",
]
