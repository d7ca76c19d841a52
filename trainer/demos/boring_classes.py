"""Small, ready-made modules and datasets (Lightning's ``demos.boring_classes`` after the rename).

Their shapes are part of the contract: tests and examples assert on them. Every model reads 32 features; the
random datasets are ``RandomDataset(size, length)`` rows of ``size`` features; ``BoringModel``'s loaders hold 64
rows, one per batch. Meant for tests, examples and reproducing a bug in a few lines, not for real training.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from trainer.core.optimizer import LightningOptimizer
from trainer.module.datamodule import DataModule
from trainer.module.train_module import TrainModule
from trainer.utilities.types import STEP_OUTPUT


class RandomDictDataset(Dataset):
    """``length`` samples ``{"a": x, "b": x + 2}``, ``x`` a random vector of ``size`` features."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        row = self.data[index]
        return {"a": row, "b": row + 2}

    def __len__(self) -> int:
        return self.len


class RandomDataset(Dataset):
    """``length`` random vectors of ``size`` features, drawn once (the same sample on every read)."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class RandomIterableDataset(IterableDataset):
    """``count`` fresh random vectors of ``size`` features per pass; no ``len()``."""

    def __init__(self, size: int, count: int) -> None:
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(self.count):
            yield torch.randn(self.size)


class RandomIterableDatasetWithLen(RandomIterableDataset):
    """``RandomIterableDataset`` that also reports its ``len()`` (``count``)."""

    def __len__(self) -> int:
        return self.count


class BoringModel(TrainModule):
    """One ``Linear(32, 2)`` trained towards ones with MSE; subclass it and override what your test is about.

    ``training_step`` returns ``{"loss": ...}``, ``validation_step`` ``{"x": ...}``, ``test_step`` ``{"y": ...}``;
    ``configure_optimizers`` gives ``[SGD(lr=0.1)], [StepLR(step_size=1)]``; each ``*_dataloader`` is
    ``DataLoader(RandomDataset(32, 64))`` (64 batches of one sample).
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def loss(self, preds: Tensor, labels: Optional[Tensor] = None) -> Tensor:
        """MSE towards ``labels``, or towards ones when none are given (so the weights always move)."""
        target = torch.ones_like(preds) if labels is None else labels
        return F.mse_loss(preds, target)

    def step(self, batch: Any) -> Tensor:
        """The loss of one batch."""
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> tuple[list[Optimizer], list[LRScheduler]]:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))


class BoringDataModule(DataModule):
    """256 random rows of 32 features split in four quarters: train, val, test, predict (64 each, batch size 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = Subset(self.random_full, indices=range(64))
        if stage in ("fit", "validate"):
            self.random_val = Subset(self.random_full, indices=range(64, 128))
        if stage == "test":
            self.random_test = Subset(self.random_full, indices=range(128, 192))
        if stage == "predict":
            self.random_predict = Subset(self.random_full, indices=range(192, 256))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.random_predict)


class BoringDataModuleNoLen(BoringDataModule):
    """Iterable random data without ``len()``: 512 train, 128 val, 256 test, 64 predict samples of 32 features."""

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = RandomIterableDataset(32, 512)
        if stage in ("fit", "validate"):
            self.random_val = RandomIterableDataset(32, 128)
        if stage == "test":
            self.random_test = RandomIterableDataset(32, 256)
        if stage == "predict":
            self.random_predict = RandomIterableDataset(32, 64)


class IterableBoringDataModule(DataModule):
    """Each stage gets a list of two loaders of 4 features: a sized ``RandomDataset`` and a ``RandomIterableDataset``
    (16 train, 32 val, 64 test, 128 predict samples each)."""

    def setup(self, stage: str) -> None:
        def both(length: int) -> list[Dataset]:
            return [RandomDataset(4, length), RandomIterableDataset(4, length)]

        if stage == "fit":
            self.train_datasets = both(16)
        if stage in ("fit", "validate"):
            self.val_datasets = both(32)
        if stage == "test":
            self.test_datasets = both(64)
        if stage == "predict":
            self.predict_datasets = both(128)

    def train_dataloader(self) -> list[DataLoader]:
        return [DataLoader(dataset) for dataset in self.train_datasets]

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(dataset) for dataset in self.val_datasets]

    def test_dataloader(self) -> list[DataLoader]:
        return [DataLoader(dataset) for dataset in self.test_datasets]

    def predict_dataloader(self) -> list[DataLoader]:
        return [DataLoader(dataset) for dataset in self.predict_datasets]


class ManualOptimBoringModel(BoringModel):
    """``BoringModel`` with manual optimisation: ``training_step`` zeroes, backwards and steps by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        optimizer = self.optimizers()
        assert isinstance(optimizer, (Optimizer, LightningOptimizer))
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class DemoModel(TrainModule):
    """``relu(Linear(32, out_dim))`` whose loss is the output's sum, trained with Adam at ``learning_rate``."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02) -> None:
        super().__init__()
        self.l1 = nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_nb: int) -> STEP_OUTPUT:
        return self(batch).sum()

    def configure_optimizers(self) -> Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """A small MNIST classifier (28x28 grey images in, log-probabilities of 10 classes out)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)
