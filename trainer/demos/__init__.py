"""Lightning's ``demos`` after the rename (``trainer.demos``): tiny models, data modules and random datasets for
examples, tests and debugging. ``trainer.demos.boring_classes`` holds them; the common ones are re-exported here."""
from trainer.demos.boring_classes import (
    BoringDataModule,
    BoringModel,
    DemoModel,
    ManualOptimBoringModel,
    RandomDataset,
    RandomIterableDataset,
)

__all__ = [
    "BoringDataModule",
    "BoringModel",
    "DemoModel",
    "ManualOptimBoringModel",
    "RandomDataset",
    "RandomIterableDataset",
]
