"""Datasets of Lightning's test helpers that the measured files use, re-made."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset


class SklearnDataset(Dataset):
    """Rows of array-likes ``x``/``y`` served as tensors of the given dtypes."""

    def __init__(self, x: Any, y: Any, x_type: torch.dtype, y_type: torch.dtype) -> None:
        self.x, self.y = x, y
        self._x_type, self._y_type = x_type, y_type

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.x[idx], dtype=self._x_type), torch.tensor(self.y[idx], dtype=self._y_type)
