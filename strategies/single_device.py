"""One process on one device: the CPU, one CUDA GPU or Apple's MPS."""
from __future__ import annotations

from typing import Optional

import torch

from trainer.strategies.checkpoint.whole_folder import WholeFolderLoading
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision import Precision
from trainer.strategies.strategy import Strategy


class SingleDeviceStrategy(WholeFolderLoading, Strategy):
    """Runs the module unwrapped on one device. ``device=None`` takes the device the Trainer resolved."""

    strategy_name = "single_device"

    def __init__(self, device: torch.device | str | None = None, precision: Optional[Precision] = None) -> None:
        super().__init__(precision=precision)
        self._device_given = device is not None
        if device is not None:
            self._root_device = torch.device(device)

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        if len(devices) * num_nodes > 1 and not self._device_given:
            raise ConfigurationError(
                f"strategy='single_device' runs one process on one device, but devices/num_nodes resolved to "
                f"{len(devices) * num_nodes} devices. Use devices=1, or strategy='ddp' to train on all of them."
            )
        root = self._root_device
        super().connect(devices, num_nodes, precision)
        if self._device_given:
            self._root_device = root

    def setup_environment(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        super().setup_environment()
