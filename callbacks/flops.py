"""FLOPs: counting what one training batch computes, and the peak a device can compute, for MFU.

:class:`BatchFlopCounter` runs one real batch under ``torch.utils.flop_counter.FlopCounterMode`` (forward and
backward, once per fit), with compiled code forced eager for that batch: Dynamo skips, for good, a frame it first
meets inside a dispatch mode, so counting must not be the first compile. Matrix products and convolutions are
counted (2 FLOPs per multiply-add), which is what the peak figures measure too; element-wise work is not.
With activation checkpointing the recomputed forward is counted as well (hardware FLOPs, not model FLOPs).

:data:`PEAK_FLOPS` holds dense (no sparsity) peak FLOP/s per GPU from NVIDIA's datasheets, per compute dtype;
:func:`peak_flops` picks the row for a device and a precision.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Optional

import torch

# (name pattern, display name, {dtype: dense peak FLOP/s}); the first pattern matching the device name wins.
PEAK_FLOPS: list[tuple[str, str, dict[str, float]]] = [
    (r"H200.*NVL", "H200 NVL", {"fp64": 60e12, "fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12}),
    (r"H200", "H200 SXM", {"fp64": 67e12, "fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}),
    (r"H100.*NVL", "H100 NVL", {"fp64": 60e12, "fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12}),
    (r"H100.*PCIe", "H100 PCIe", {"fp64": 51e12, "fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12}),
    (r"H100", "H100 SXM", {"fp64": 67e12, "fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}),
    (r"A100", "A100", {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}),
    (r"L40S", "L40S", {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12}),
    (r"\bL4\b", "L4", {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12}),
    (r"\bA10\b", "A10", {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12}),
    (r"V100.*PCIe", "V100 PCIe", {"fp64": 7e12, "fp32": 14e12, "fp16": 112e12}),
    (r"V100", "V100 SXM2", {"fp64": 7.8e12, "fp32": 15.7e12, "fp16": 125e12}),
    (r"\bT4\b", "T4", {"fp32": 8.1e12, "fp16": 65e12}),
]


def compute_dtype(precision: str) -> str:
    """The dtype matrix products run in under a precision: bf16, fp16, fp64, or fp32/tf32 (TF32 when float32
    matmuls may use it, ``torch.backends.cuda.matmul.allow_tf32``)."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith("64"):
        return "fp64"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def peak_flops(device_name: str, precision: str) -> Optional[tuple[float, str]]:
    """``(FLOP/s, "H100 SXM bf16")`` for a GPU name (``torch.cuda.get_device_name()``) and a precision, or
    ``None`` when the device or its dtype is not in :data:`PEAK_FLOPS`."""
    dtype = compute_dtype(precision)
    for pattern, name, figures in PEAK_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            peak = figures.get(dtype)
            return (peak, f"{name} {dtype}") if peak is not None else None
    return None


def device_peak_flops(device: torch.device, precision: str) -> Optional[tuple[float, str]]:
    """:func:`peak_flops` for a ``torch.device`` (``None`` on the CPU and for unlisted GPUs)."""
    if device.type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(device), precision)


class BatchFlopCounter:
    """Counts the FLOPs run between :meth:`start` and :meth:`stop` (one training batch)."""

    def __init__(self) -> None:
        self.flops: Optional[int] = None
        self._mode: Any = None
        self._eager: Any = None

    def start(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        if "torch._dynamo" in sys.modules:  # something may be compiled: run this batch eagerly (see module docstring)
            self._eager = torch.compiler.set_stance("force_eager")
            self._eager.__enter__()
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._mode is not None

    def stop(self) -> Optional[int]:
        """End counting; returns the FLOPs counted (also kept in :attr:`flops`)."""
        if self._mode is None:
            return self.flops
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        if self._eager is not None:
            eager, self._eager = self._eager, None
            eager.__exit__(None, None, None)
        self.flops = int(mode.get_total_flops())
        return self.flops
