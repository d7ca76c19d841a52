"""Lightning's ``demos`` after the rename (``trainer.demos``): tiny models, data modules and random datasets for
examples, tests and debugging (``trainer.demos.boring_classes``), and a small Transformer language model with
WikiText-2 read from a local file (``trainer.demos.transformer``, ``trainer.demos.wikitext``)."""
from trainer.demos.boring_classes import (
    BoringDataModule,
    BoringModel,
    DemoModel,
    ManualOptimBoringModel,
    RandomDataset,
    RandomIterableDataset,
)
from trainer.demos.transformer import LightningTransformer, Transformer
from trainer.demos.wikitext import WikiText2

__all__ = [
    "BoringDataModule",
    "BoringModel",
    "DemoModel",
    "ManualOptimBoringModel",
    "RandomDataset",
    "RandomIterableDataset",
    "LightningTransformer",
    "Transformer",
    "WikiText2",
]
