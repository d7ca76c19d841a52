"""Precision plugins: the dtype a module computes in, and the loss scaling and autocast around each step.

One file per plugin: ``Precision`` (32-bit, the interface: ``base.py``), ``DoublePrecision`` (``double.py``),
``HalfPrecision`` (16-true, bf16-true: ``half.py``), ``MixedPrecision`` (torch.amp: ``mixed.py``); and
``precision_plugin(value)`` here, which turns a Trainer's ``precision=`` into one."""
from __future__ import annotations

from typing import Any

from trainer.strategies.precision.base import VALID_PRECISIONS, Precision, canonical_precision
from trainer.strategies.precision.double import DoublePrecision
from trainer.strategies.precision.half import HalfPrecision
from trainer.strategies.precision.mixed import MixedPrecision

__all__ = [
    "DoublePrecision", "HalfPrecision", "MixedPrecision", "Precision", "VALID_PRECISIONS", "canonical_precision",
    "precision_plugin",
]  # fmt: skip


def precision_plugin(value: Any) -> Precision:
    """Build the plugin for a precision spelling (a ``Precision`` instance is returned as is)."""
    if isinstance(value, Precision):
        return value
    name = canonical_precision(value)
    if name == "32-true":
        return Precision()
    if name == "64-true":
        return DoublePrecision()
    if name in ("16-mixed", "bf16-mixed"):
        return MixedPrecision(name)
    return HalfPrecision(name)
