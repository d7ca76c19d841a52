"""Our stand-ins for Lightning's ``tests_pytorch.helpers``, written against the framework's public API."""

from trainer.demos.boring_classes import BoringDataModule, BoringModel, ManualOptimBoringModel, RandomDataset

__all__ = ["BoringDataModule", "BoringModel", "ManualOptimBoringModel", "RandomDataset"]
