"""``DataModule``: the data side of an experiment in one reusable class."""
from __future__ import annotations

import inspect
import os
from typing import Any, Iterable, Optional, Union

from trainer.module.hparams import AttributeDict, hyperparameters_of_call


class DataModule:
    """Groups download/preparation, splits and the four dataloaders. Override what you need.

    ``prepare_data`` runs once per node (local rank 0; ``prepare_data_per_node = False``: once) before ``setup``; ``setup(stage)`` runs on every
    process. ``state_dict``/``load_state_dict`` are saved in checkpoints.
    """

    #: ``prepare_data`` runs on local rank 0 of every node (True) or on global rank 0 only (False).
    prepare_data_per_node: bool = True

    def __init__(self) -> None:
        self.trainer: Any = None
        self._hparams = AttributeDict()

    @property
    def hparams(self) -> AttributeDict:
        """Hyperparameters recorded by :meth:`save_hyperparameters` (sent to the loggers with the module's)."""
        return self.__dict__.setdefault("_hparams", AttributeDict())  # also when a subclass skipped __init__

    def save_hyperparameters(
        self, *args: Any, ignore: Optional[Union[str, Iterable[str]]] = None, frame: Any = None, logger: bool = True
    ) -> None:
        """Record the ``__init__`` arguments (all, or those named in ``args``) in ``self.hparams``, as a module's
        (``logger=False``: not sent to the loggers)."""
        self._log_hyperparams = logger
        caller = frame or inspect.currentframe().f_back
        self.hparams.update(hyperparameters_of_call(self, caller, args, ignore))

    def prepare_data(self) -> None:
        """Download or write data to disk. Called on local rank 0 only; do not set state here."""

    def setup(self, stage: str) -> None:
        """Build datasets/splits for ``stage`` ("fit", "validate", "test", "predict") on every process."""

    def teardown(self, stage: str) -> None:
        """Release what ``setup`` made."""

    def train_dataloader(self) -> Any:
        """The training DataLoader."""
        return None

    def val_dataloader(self) -> Any:
        """The validation DataLoader (or a list of them)."""
        return None

    def test_dataloader(self) -> Any:
        """The test DataLoader (or a list of them)."""
        return None

    def predict_dataloader(self) -> Any:
        """The prediction DataLoader (or a list of them)."""
        return None

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Any = None,
        val_dataset: Any = None,
        test_dataset: Any = None,
        predict_dataset: Any = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> "DataModule":
        """A DataModule whose dataloaders read the given datasets (as Lightning's): each a ``Dataset`` or a
        list/dict of them (one DataLoader each); the training ones shuffle (an ``IterableDataset`` cannot).

        ``batch_size`` and ``num_workers`` go to every DataLoader, and to ``cls.__init__`` where it takes them;
        ``datamodule_kwargs`` go to ``cls.__init__``. The Trainer pins memory itself when training on CUDA."""
        from torch.utils.data import DataLoader, Dataset, IterableDataset

        def loaders(datasets: Any, shuffle: bool) -> Any:
            if isinstance(datasets, Dataset):
                return DataLoader(datasets, batch_size=batch_size, num_workers=num_workers,
                                  shuffle=shuffle and not isinstance(datasets, IterableDataset))  # fmt: skip
            if isinstance(datasets, dict):
                return {key: loaders(value, shuffle) for key, value in datasets.items()}
            if isinstance(datasets, (list, tuple)):
                return type(datasets)(loaders(value, shuffle) for value in datasets)
            raise TypeError(f"DataModule.from_datasets: {type(datasets).__name__} is not a torch Dataset (nor a "
                            "list/dict of them).")  # fmt: skip

        parameters = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        extra = {name: value for name, value in (("batch_size", batch_size), ("num_workers", num_workers))
                 if takes_any or name in parameters}  # fmt: skip
        datamodule = cls(**datamodule_kwargs, **extra)
        for name, datasets, shuffle in (("train_dataloader", train_dataset, True), ("val_dataloader", val_dataset, False),
                                        ("test_dataloader", test_dataset, False),
                                        ("predict_dataloader", predict_dataset, False)):  # fmt: skip
            if datasets is not None:
                loaders(datasets, shuffle)  # a wrong type fails here, not at fit
                setattr(datamodule, name, lambda datasets=datasets, shuffle=shuffle: loaders(datasets, shuffle))
        return datamodule

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device; overriding it here takes precedence over the module's."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        """Move a batch (of a type the Trainer cannot move) to ``device``; takes precedence over the module's."""
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch on the device; overriding it here takes precedence over the module's."""
        return batch

    def on_exception(self, exception: BaseException) -> None:
        """Called when fit/validate/test/predict raises (after the callbacks' ``on_exception``)."""

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __str__(self) -> str:
        """One line per dataloader method with its dataset sizes, as Lightning prints a datamodule:
        ``{Train dataloader: size=64}``, ``{Validation dataloader: 1. size=8 ; 2. size=8}``, ``None`` where there is
        none (or building it failed)."""
        lines = []
        for title, method in (("Train dataloader", "train_dataloader"), ("Validation dataloader", "val_dataloader"),
                              ("Test dataloader", "test_dataloader"), ("Predict dataloader", "predict_dataloader")):  # fmt: skip
            try:
                loaders = getattr(self, method)()
            except Exception:  # a loader that cannot be built before setup() is reported as missing
                loaders = None
            if loaders is None:
                text = "None"
            elif isinstance(loaders, (list, tuple, dict)):
                items = loaders.values() if isinstance(loaders, dict) else loaders
                text = " ; ".join(f"{i}. size={_dataset_size(loader)}" for i, loader in enumerate(items, start=1))
            else:
                text = f"size={_dataset_size(loaders)}"
            lines.append(f"{{{title}: {text}}}")
        return os.linesep.join(lines)


def _dataset_size(loader: Any) -> str:
    try:
        return str(len(loader.dataset))
    except (AttributeError, TypeError):
        return "NA"
