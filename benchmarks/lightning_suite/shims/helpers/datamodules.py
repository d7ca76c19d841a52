"""DataModules over scikit-learn's synthetic data (Lightning's test helpers, re-made)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from trainer import DataModule

from .datasets import SklearnDataset


class SklearnDataModule(DataModule):
    """Splits ``(x, y)`` 80/20 into train+val / test, then train+val 60/40 (fixed seed 42), batches of ``batch_size``."""

    def __init__(self, sklearn_dataset: tuple[Any, Any], x_type: torch.dtype, y_type: torch.dtype,
                 batch_size: int = 10) -> None:  # fmt: skip
        from sklearn.model_selection import train_test_split

        super().__init__()
        self.batch_size = batch_size
        self._x, self._y = sklearn_dataset
        self._x_type, self._y_type = x_type, y_type
        x_fit, self.x_test, y_fit, self.y_test = train_test_split(self._x, self._y, test_size=0.2, random_state=42)
        self.x_train, self.x_valid, self.y_train, self.y_valid = train_test_split(
            x_fit, y_fit, test_size=0.4, random_state=42
        )

    def _loader(self, x: Any, y: Any) -> DataLoader:
        return DataLoader(SklearnDataset(x, y, self._x_type, self._y_type), batch_size=self.batch_size)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.x_train, self.y_train)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.x_valid, self.y_valid)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.x_test, self.y_test)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.x_test, self.y_test)

    @property
    def sample(self) -> torch.Tensor:
        return torch.tensor([self._x[0]], dtype=self._x_type)


class ClassifDataModule(SklearnDataModule):
    """``make_classification`` data (seed 42): ``length`` rows of ``num_features``, ``num_classes`` classes."""

    def __init__(self, num_features: int = 32, length: int = 800, num_classes: int = 3, batch_size: int = 10,
                 n_clusters_per_class: int = 1, n_informative: int = 2) -> None:  # fmt: skip
        from sklearn.datasets import make_classification

        data = make_classification(n_samples=length, n_features=num_features, n_classes=num_classes,
                                   n_clusters_per_class=n_clusters_per_class, n_informative=n_informative,
                                   random_state=42)  # fmt: skip
        super().__init__(data, x_type=torch.float32, y_type=torch.long, batch_size=batch_size)


class RegressDataModule(SklearnDataModule):
    """``make_regression`` data (seed 42), targets as one-column rows."""

    def __init__(self, num_features: int = 16, length: int = 800, batch_size: int = 10) -> None:
        from sklearn.datasets import make_regression

        x, y = make_regression(n_samples=length, n_features=num_features, random_state=42)
        super().__init__((x, [[v] for v in y]), x_type=torch.float32, y_type=torch.float32, batch_size=batch_size)
