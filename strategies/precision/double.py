""""64-true": float64 weights, inputs and new tensors."""
from __future__ import annotations

from typing import Any, ContextManager

import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision.base import Precision, _apply_to_floating, _default_dtype

class DoublePrecision(Precision):
    """"64-true": parameters, buffers and floating inputs in float64; new tensors default to float64."""

    name = "64-true"
    converts_input = True

    def setup(self, device: torch.device) -> None:
        if device.type == "mps":
            raise ConfigurationError(
                "precision='64-true' is not supported on MPS (Apple GPUs have no float64). "
                "Use precision='32-true' or accelerator='cpu'."
            )
        super().setup(device)

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.double()

    def convert_input(self, data: Any) -> Any:
        return _apply_to_floating(data, torch.float64)

    def forward_context(self) -> ContextManager:
        return _default_dtype(torch.float64)

    def init_context(self) -> ContextManager:
        return _default_dtype(torch.float64)
