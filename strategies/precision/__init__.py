"""Precision plugins: the dtype a module computes in, and the loss scaling and autocast around each step.

``Precision`` (32-bit), ``DoublePrecision``, ``HalfPrecision`` (16-true, bf16-true), ``MixedPrecision``
(torch.amp), and ``precision_plugin(value)`` that turns a Trainer's ``precision=`` into one."""
from trainer.strategies.precision.plugins import (
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    canonical_precision,
    precision_plugin,
)

__all__ = ["DoublePrecision", "HalfPrecision", "MixedPrecision", "Precision", "canonical_precision", "precision_plugin"]
