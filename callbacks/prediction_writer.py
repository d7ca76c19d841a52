"""``BasePredictionWriter``: write predictions as ``predict`` produces them (per batch, at the end, or both).

Subclass it and override ``write_on_batch_end`` and/or ``write_on_epoch_end``; ``write_interval`` says which
of the two run. With ``trainer.predict(model, return_predictions=False)`` the predictions are written and not
kept in memory (unless the writer writes at the epoch's end, which needs them all).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal, Optional

from torch.utils.data import BatchSampler, SequentialSampler

from trainer.callbacks.callback import Callback
from trainer.callbacks.host import takes_dataloader_iter
from trainer.strategies.errors import ConfigurationError

#: The accepted ``write_interval`` values.
WRITE_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    """Base class of callbacks that store predictions (as Lightning's).

    ``write_on_batch_end(trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx)`` runs after
    each ``predict_step`` when ``write_interval`` is ``"batch"`` or ``"batch_and_epoch"``;
    ``write_on_epoch_end(trainer, module, predictions, batch_indices)`` once at the end when it is ``"epoch"`` or
    ``"batch_and_epoch"``, with one list per dataloader (a flat list for one dataloader, as ``predict`` returns).
    ``batch_indices`` are the dataset indices of the batch, known when the loader draws them in order (the
    default ``shuffle=False``); with a shuffling sampler they are ``None``.
    """

    def __init__(self, write_interval: Literal["batch", "epoch", "batch_and_epoch"] = "batch") -> None:
        if write_interval not in WRITE_INTERVALS:
            raise ConfigurationError(f"`write_interval` should be one of {list(WRITE_INTERVALS)}; got "
                                     f"{write_interval!r}.")  # fmt: skip
        self.interval = write_interval
        self._on_batch = write_interval in ("batch", "batch_and_epoch")
        self._on_epoch = write_interval in ("epoch", "batch_and_epoch")
        self._predictions: list[list[Any]] = []
        self._batch_indices: list[list[Any]] = []
        self._loader_indices: list[Optional[list[list[int]]]] = []

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if stage == "predict" and takes_dataloader_iter(module.predict_step):
            raise NotImplementedError("The `PredictionWriterCallback` does not support using `dataloader_iter` in "
                                      "`predict_step`: it writes per batch, and such a step takes many batches.")  # fmt: skip

    def write_on_batch_end(self, trainer: Any, module: Any, prediction: Any, batch_indices: Optional[Sequence[int]],
                           batch: Any, batch_idx: int, dataloader_idx: int) -> None:  # fmt: skip
        """Override with the logic to write one batch's prediction."""
        raise NotImplementedError(f"{type(self).__name__} writes per batch (write_interval={self.interval!r}) and "
                                  "must override `write_on_batch_end`.")  # fmt: skip

    def write_on_epoch_end(self, trainer: Any, module: Any, predictions: Sequence[Any],
                           batch_indices: Sequence[Any]) -> None:  # fmt: skip
        """Override with the logic to write all predictions."""
        raise NotImplementedError(f"{type(self).__name__} writes at the end (write_interval={self.interval!r}) and "
                                  "must override `write_on_epoch_end`.")  # fmt: skip

    def on_predict_epoch_start(self, trainer: Any, module: Any) -> None:
        loaders = trainer.predict_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        self._loader_indices = [_ordered_batch_indices(loader) for loader in loaders]
        self._predictions = [[] for _ in loaders]
        self._batch_indices = [[] for _ in loaders]

    def on_predict_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:  # fmt: skip
        known = self._loader_indices[dataloader_idx] if dataloader_idx < len(self._loader_indices) else None
        indices = known[batch_idx] if known is not None and batch_idx < len(known) else None
        if self._on_batch:
            self.write_on_batch_end(trainer, module, outputs, indices, batch, batch_idx, dataloader_idx)
        if self._on_epoch:
            self._predictions[dataloader_idx].append(outputs)
            self._batch_indices[dataloader_idx].append(indices)

    def on_predict_epoch_end(self, trainer: Any, module: Any) -> None:
        if not self._on_epoch:
            return
        several = len(self._predictions) > 1
        predictions = self._predictions if several else self._predictions[0]
        indices = self._batch_indices if several else self._batch_indices[0]
        self._predictions, self._batch_indices = [], []  # not kept past the run
        self.write_on_epoch_end(trainer, module, predictions, indices)


def _ordered_batch_indices(loader: Any) -> Optional[list[list[int]]]:
    """The dataset indices of each batch when the loader draws them in order (a ``SequentialSampler`` batched by a
    plain ``BatchSampler``, or a distributed sampler without shuffling); ``None`` otherwise."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if type(batch_sampler) is not BatchSampler:
        return None
    sampler = batch_sampler.sampler
    ordered = type(sampler) is SequentialSampler or (hasattr(sampler, "num_replicas")
                                                     and getattr(sampler, "shuffle", True) is False)  # fmt: skip
    if not ordered:
        warnings.warn("BasePredictionWriter: the predict dataloader shuffles, so the batch indices passed to the "
                      "write hooks are None.", UserWarning, stacklevel=2)  # fmt: skip
        return None
    return [list(indices) for indices in batch_sampler]  # no randomness to consume: drawing in order
