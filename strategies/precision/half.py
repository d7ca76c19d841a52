""""16-true"/"bf16-true": weights, inputs and optimizer state all in half precision."""
from __future__ import annotations

import warnings
from typing import Any, ContextManager

import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision.base import Precision, _apply_to_floating, _check_dtype_supported, _default_dtype

class HalfPrecision(Precision):
    """"16-true"/"bf16-true": weights, inputs and optimizer state all in float16/bfloat16 (no master copy).

    Halves memory against mixed precision but updates lose precision; the optimizer state is half too
    (a one-time warning says so).
    """

    converts_input = True

    def __init__(self, precision: str = "bf16-true") -> None:
        if precision not in ("16-true", "bf16-true"):
            raise ConfigurationError(f"HalfPrecision takes '16-true' or 'bf16-true', got {precision!r}.")
        self.name = precision
        self.dtype = torch.float16 if precision == "16-true" else torch.bfloat16
        self._warned = False

    def setup(self, device: torch.device) -> None:
        _check_dtype_supported(self.name, self.dtype, device)
        super().setup(device)

    def convert_module(self, module: nn.Module) -> nn.Module:
        if not self._warned:
            warnings.warn(
                f"precision={self.name!r} keeps the weights in {self.dtype} with no float32 master copy, so the "
                f"optimizer state (e.g. Adam moments) is {self.dtype} too. Use "
                f"'{self.name.replace('-true', '-mixed')}' if updates stall or diverge.",
                stacklevel=2,
            )
            self._warned = True
        return module.to(self.dtype)

    def convert_input(self, data: Any) -> Any:
        return _apply_to_floating(data, self.dtype)

    def forward_context(self) -> ContextManager:
        return _default_dtype(self.dtype)

    def init_context(self) -> ContextManager:
        return _default_dtype(self.dtype)
