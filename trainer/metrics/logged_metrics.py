"""What ``self.log`` records: per-name values, accumulated lazily on the device.

The hot path (``ResultCollection.log``) stores a detached reference for step values and, for epoch
values, adds ``value * batch_size`` into an on-device accumulator in place. Nothing is read on the host
until a consumer asks (a logger at its interval, a callback reading ``trainer.callback_metrics``, the
progress bar at its refresh rate).

Cross-rank reductions (``sync_dist=True``, and torchmetrics' own sync in ``compute()``) happen only when the
Trainer asks with ``sync=True`` at points every rank reaches together: the logging interval, the end of a
training epoch, the end of an evaluation epoch. Any other read (``trainer.callback_metrics`` from a
callback that runs on rank 0 only, say) returns the last synchronised value or the local one, and never
issues a collective, so it cannot deadlock.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from trainer.strategies.errors import ConfigurationError

_REDUCE_NAMES = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
# Python's built-in sum/max/min are accepted as Lightning accepts them (``self.log(..., reduce_fx=max)``).
_REDUCE_FUNCS = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min", sum: "sum", max: "max", min: "min"}


def _reduce_name(reduce_fx: Union[str, Callable]) -> str:
    if isinstance(reduce_fx, str) and reduce_fx.lower() in _REDUCE_NAMES:
        return _REDUCE_NAMES[reduce_fx.lower()]
    if reduce_fx in _REDUCE_FUNCS:
        return _REDUCE_FUNCS[reduce_fx]
    raise ConfigurationError(
        f"self.log(reduce_fx={reduce_fx!r}) is not supported: only `self.log(..., reduce_fx={{min,max,mean,sum}})` "
        "are supported ('mean', 'sum', 'max', 'min', torch.mean/sum/max/min, or Python's sum/max/min)."
    )


def _is_metric(value: Any) -> bool:
    # torchmetrics is imported only if the user imported it: no import cost for users without metrics.
    module = sys.modules.get("torchmetrics")
    return module is not None and isinstance(value, module.Metric)


def extract_batch_size(batch: Any) -> int:
    """The size of the first dimension of the first tensor found in a (nested) batch; 1 if none."""
    if isinstance(batch, Tensor):
        return batch.size(0) if batch.ndim > 0 else 1
    if isinstance(batch, dict):
        for value in batch.values():
            return extract_batch_size(value)
    if isinstance(batch, (list, tuple)) and batch:
        if isinstance(batch[0], (Tensor, list, tuple, dict)):
            return extract_batch_size(batch[0])
        return len(batch)
    return 1


class LoggedValue:
    """One logged name: its options, its latest step value and its epoch accumulator."""

    __slots__ = (
        "name", "options", "on_step", "on_epoch", "prog_bar", "logger", "reduce", "sync_dist",
        "call", "dataloader_idx", "step_key", "epoch_key", "last", "total", "weight", "metric",
        "_step_cache", "_epoch_cache",
    )  # fmt: skip

    def __init__(self, name: str, key: str, options: tuple, call: tuple, dataloader_idx: Optional[int]) -> None:
        self.name = key
        self.options = options
        self.on_step, self.on_epoch, self.prog_bar, self.logger, self.reduce, self.sync_dist = options
        self.call = call  # the self.log arguments it was made from (ResultCollection.log compares them)
        # The dataloader it was logged from (None at epoch level or with one loader), whether or not its
        # index is in the name: add_dataloader_idx=False values belong to their own loader's results.
        self.dataloader_idx = dataloader_idx
        # Logged both per step and per epoch: Lightning's forked names, suffix before the loader index
        # ("x_epoch/dataloader_idx_0").
        suffix = key[len(name):]
        forked = self.on_step and self.on_epoch
        self.step_key = f"{name}_step{suffix}" if forked else key
        self.epoch_key = f"{name}_epoch{suffix}" if forked else key
        self.last: Any = None
        self.total: Any = None
        self.weight = 0
        self.metric: Any = None
        self._step_cache: Any = None
        self._epoch_cache: Any = None

    def update(self, value: Any, batch_size: Optional[int], results: "ResultCollection") -> None:
        self._step_cache = None
        self._epoch_cache = None
        if isinstance(value, Tensor):
            if value.__class__ is not Tensor and hasattr(value, "full_tensor"):
                value = _dtensor_value(value)
            if value.requires_grad:  # no graph kept; a tensor without one is stored as it is (detach costs a tensor)
                value = value.detach()
            self.last = value
            if not self.on_epoch:
                return
            if value.ndim:
                value = value.reshape(())
            reduce = self.reduce
            if reduce == "mean":
                size = batch_size if batch_size is not None else results.current_batch_size()
                if self.total is None:
                    self.total = torch.zeros((), dtype=_accumulator_dtype(value), device=value.device)
                self.total.add_(value, alpha=size)
                self.weight += size
            elif reduce == "sum":
                if self.total is None:
                    self.total = torch.zeros((), dtype=_accumulator_dtype(value), device=value.device)
                self.total.add_(value)
                self.weight += 1
            else:
                value = value.to(_accumulator_dtype(value))
                if self.total is None:
                    self.total = value.clone()
                elif reduce == "max":
                    torch.maximum(self.total, value, out=self.total)
                else:
                    torch.minimum(self.total, value, out=self.total)
                self.weight += 1
            return
        if self.metric is not None or _is_metric(value):
            self.metric = value
            self.last = value
            return
        value = float(value)
        self.last = value
        if self.on_epoch:
            reduce = self.reduce
            if reduce == "mean":
                size = batch_size if batch_size is not None else results.current_batch_size()
                self.total = (self.total or 0.0) + value * size
                self.weight += size
            elif reduce == "sum":
                self.total = (self.total or 0.0) + value
                self.weight += 1
            else:
                self.total = value if self.total is None else (max if reduce == "max" else min)(self.total, value)
                self.weight += 1

    def step_value(self, reduce_fn: Callable[[Tensor, str], Tensor], sync: bool, distributed: bool) -> Any:
        """The latest value. With ``sync_dist`` it is reduced across ranks only when ``sync`` is True (and
        cached until the next update); otherwise the local value is returned."""
        if self._step_cache is not None:
            return self._step_cache
        value = self.last
        if self.metric is not None:
            value = getattr(self.metric, "_forward_cache", None)
            if value is None:
                return None
        if not isinstance(value, Tensor):
            value = torch.tensor(value)
        if self.sync_dist and distributed:
            if not sync:
                return value
            value = reduce_fn(value.clone(), self.reduce)
        self._step_cache = value
        return value

    def epoch_value(self, reduce_fn: Callable[[Tensor, str], Tensor], sync: bool, distributed: bool) -> Any:
        """The epoch aggregate so far (weighted mean, sum, max or min). Cross-rank reductions, including a
        torchmetrics ``compute()``, run only when ``sync`` is True; the result is cached until the next update."""
        if self._epoch_cache is not None:
            return self._epoch_cache
        if self.metric is not None:
            if distributed and not sync:
                return None  # compute() would be a collective
            self._epoch_cache = self.metric.compute()
            return self._epoch_cache
        if self.weight == 0:
            return None
        total = self.total if isinstance(self.total, Tensor) else torch.tensor(self.total, dtype=torch.float64)
        reduce_now = self.sync_dist and distributed
        if reduce_now and not sync:
            return (total / self.weight if self.reduce == "mean" else total).to(torch.float32)
        if self.reduce == "mean":
            if reduce_now:
                weight = torch.tensor(float(self.weight), dtype=torch.float64, device=total.device)
                pair = reduce_fn(torch.stack([total.to(torch.float64), weight]), "sum")
                value = pair[0] / pair[1]
            else:
                value = total / self.weight
        else:
            value = reduce_fn(total.clone(), self.reduce) if reduce_now else total
        self._epoch_cache = value.to(torch.float32)
        return self._epoch_cache

    def reset_epoch(self) -> None:
        self.total = None
        self.weight = 0
        self._epoch_cache = None
        if self.metric is not None and hasattr(self.metric, "reset"):
            self.metric.reset()


def _accumulator_dtype(value: Tensor) -> torch.dtype:
    return torch.float32 if value.device.type == "mps" else torch.float64


class ResultCollection:
    """All values logged in one stage ("train", "validate", "test", "predict").

    ``epoch_level`` is set by the loop: False while running batch-level code (defaults on_step=True in
    training), True in epoch-level hooks (defaults on_epoch=True). Evaluation stages default to epoch values.
    """

    def __init__(self, stage: str, strategy: Any) -> None:
        self.stage = stage
        self.training = stage == "train"
        self.epoch_level = False
        self.epoch_done = False
        self.values: dict[str, LoggedValue] = {}
        self.batch: Any = None  # the current batch: the loops set it before each step
        self._batch_size = 1
        self._sized_batch: Any = None  # the batch _batch_size is of (the reference keeps its id from being reused)
        self.dataloader_idx: Optional[int] = None  # set by evaluation loops with several dataloaders
        self.has_step_values = False  # something was logged on_step=True: evaluation loops then send it per batch
        self.seen_batches: list[int] = []  # evaluation batches sent per dataloader: their logger step (kept by reset)
        self._strategy = strategy  # reduces sync_dist values (Strategy.reduce) at sync points
        self._reduce_fn = strategy.reduce

    # ------------------------------------------------------------------ hot path
    def current_batch_size(self) -> int:
        """The size of the current batch, inferred once per batch."""
        batch = self.batch
        if self._sized_batch is not batch:
            self._batch_size = extract_batch_size(batch)
            self._sized_batch = batch
        return self._batch_size

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool,
        logger: bool,
        on_step: Optional[bool],
        on_epoch: Optional[bool],
        reduce_fx: Union[str, Callable],
        sync_dist: bool,
        batch_size: Optional[int],
        add_dataloader_idx: bool,
    ) -> None:
        # The call as made (defaults not yet resolved, with the level that resolves them): a repeated call
        # compares one tuple and updates.
        call = (on_step, on_epoch, prog_bar, logger, reduce_fx, sync_dist, self.epoch_level)
        dataloader_idx = self.dataloader_idx
        key = name if dataloader_idx is None or not add_dataloader_idx else f"{name}/dataloader_idx_{dataloader_idx}"
        entry = self.values.get(key)
        if entry is None or entry.call != call or entry.dataloader_idx != dataloader_idx:
            # Checked when a key's entry is made, not on every call (a refused name never gets one).
            if add_dataloader_idx and isinstance(name, str) and "/dataloader_idx_" in name:
                raise ConfigurationError(f"You called `self.log` with the key `{name}` but it should not contain "
                                         "information about `dataloader_idx` when `add_dataloader_idx=True`: the "
                                         "suffix is added for you with several dataloaders.")  # fmt: skip
            entry = self._new_entry(name, key, value, call, dataloader_idx, entry)
        entry.update(value, batch_size, self)

    def _new_entry(
        self,
        name: str,
        key: str,
        value: Any,
        call: tuple,
        dataloader_idx: Optional[int],
        previous: Optional[LoggedValue],
    ) -> LoggedValue:
        on_step, on_epoch, prog_bar, logger, reduce_fx, sync_dist, epoch_level = call
        if (previous is not None and previous.dataloader_idx is not None and dataloader_idx is not None
                and previous.dataloader_idx != dataloader_idx):  # fmt: skip
            raise ConfigurationError(
                f"self.log({name!r}, add_dataloader_idx=False) was called from dataloader {previous.dataloader_idx} "
                f"and from dataloader {dataloader_idx}: their values would mix. Give each dataloader its own name "
                "(e.g. f'{name}_{dataloader_idx}') or leave add_dataloader_idx=True."
            )
        if on_step is None:
            on_step = self.training and not epoch_level
        if on_epoch is None:
            on_epoch = not self.training or epoch_level
        reduce = _reduce_name(reduce_fx)
        options = (on_step, on_epoch, prog_bar, logger, reduce, sync_dist)
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"self.log(name={key!r}): the name must be a non-empty string.")
        if on_step and epoch_level:
            raise ConfigurationError(
                f"self.log({key!r}, on_step=True) was called from an epoch-level hook, where there is no step. "
                "Use on_step=False (the default there)."
            )
        if not on_step and not on_epoch:
            raise ConfigurationError(f"self.log({key!r}) with on_step=False and on_epoch=False records nothing: "
                                     "`self.log(on_step=False, on_epoch=False)` is not useful.")  # fmt: skip
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ConfigurationError(
                    f"`self.log({name}, {value})` was called, but the tensor must have a single element (a scalar); "
                    f"it has shape {tuple(value.shape)}. Reduce it first (e.g. `self.log({name!r}, value.mean())`)."
                )
            if value.is_complex():
                raise ConfigurationError(f"self.log({key!r}, value): complex tensors cannot be logged.")
        elif not _is_metric(value) and not isinstance(value, (int, float)):
            raise ConfigurationError(
                f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be logged: log "
                "a number, a scalar tensor or a torchmetrics.Metric (several values: one self.log each, or log_dict)."
            )
        entry = LoggedValue(name, key, options, call, dataloader_idx)
        if on_step and logger:
            self.has_step_values = True
        if (previous is not None and previous.options[:2] == options[:2] and previous.reduce == reduce
                and previous.dataloader_idx == dataloader_idx):  # fmt: skip
            # Only display options changed (prog_bar/logger): keep the accumulated epoch state.
            entry.total, entry.weight, entry.metric = previous.total, previous.weight, previous.metric
        self.values[key] = entry
        return entry

    # ------------------------------------------------------------------ consumers (off the hot path)
    def reset_epoch(self) -> None:
        """Clear epoch accumulators (and torchmetrics states) at the start of an epoch."""
        self.epoch_done = False
        for entry in self.values.values():
            entry.reset_epoch()

    def reset(self) -> None:
        """Forget every value and reset logged torchmetrics objects (a new evaluation run starts clean)."""
        for entry in self.values.values():
            if entry.metric is not None and hasattr(entry.metric, "reset"):
                entry.metric.reset()
        self.values.clear()
        self.epoch_done = False
        self.has_step_values = False

    def step_metrics(self, logger_only: bool = False, sync: bool = False) -> dict[str, Any]:
        """Latest step values; keys get a ``_step`` suffix when the name is also logged per epoch."""
        distributed = self._strategy.world_size > 1
        out: dict[str, Any] = {}
        for key, entry in self.values.items():
            if not entry.on_step or entry.last is None or (logger_only and not entry.logger):
                continue
            value = entry.step_value(self._reduce_fn, sync, distributed)
            if value is not None:
                out[entry.step_key] = value
        return out

    def epoch_metrics(self, logger_only: bool = False, sync: bool = False) -> dict[str, Any]:
        """Epoch aggregates so far; keys get an ``_epoch`` suffix when the name is also logged per step."""
        distributed = self._strategy.world_size > 1
        out: dict[str, Any] = {}
        for key, entry in self.values.items():
            if not entry.on_epoch or (logger_only and not entry.logger):
                continue
            value = entry.epoch_value(self._reduce_fn, sync, distributed)
            if value is not None:
                out[entry.epoch_key] = value
        return out

    def sync(self, epoch: bool) -> None:
        """Reduce every ``sync_dist`` value (and compute torchmetrics) across ranks now: a collective that
        every rank must reach. ``epoch=False`` syncs step values only."""
        self.step_metrics(sync=True)
        if epoch:
            self.epoch_metrics(sync=True)

    def callback_metrics(self, epoch_done: bool) -> dict[str, Any]:
        """Every value under its plain name (epoch value once the epoch is done, else the latest step value).

        In validation/test only epoch values count, once the epoch is done (as in Lightning: a value logged
        ``on_step=True, on_epoch=False`` there goes to the loggers, not to what callbacks monitor)."""
        if not self.training:
            if not epoch_done:
                return {}
            out = self.epoch_metrics()
            for entry in self.values.values():
                if entry.on_step and entry.on_epoch and entry.epoch_key in out:
                    out[entry.name] = out[entry.epoch_key]
            return out
        out = self.step_metrics()
        epoch = self.epoch_metrics()
        out.update(epoch)
        for key, entry in self.values.items():
            if entry.on_step and entry.on_epoch:
                plain = out.get(entry.epoch_key) if epoch_done else out.get(entry.step_key)
                if plain is not None:
                    out[key] = plain
        return out

    def eval_step_metrics(self, dataloader_idx: Optional[int]) -> dict[str, Any]:
        """The values logged ``on_step=True`` (for the loggers) in the evaluation batch that just ran on
        ``dataloader_idx``: Lightning sends them after every validation/test batch. ``sync_dist`` values are
        reduced here, so every rank calls it."""
        distributed = self._strategy.world_size > 1
        out: dict[str, Any] = {}
        for entry in self.values.values():
            if entry.on_step and entry.logger and entry.last is not None and entry.dataloader_idx == dataloader_idx:
                value = entry.step_value(self._reduce_fn, True, distributed)
                if value is not None:
                    out[entry.step_key] = value
        return out

    def prog_bar_metrics(self) -> dict[str, float]:
        """Values logged with ``prog_bar=True`` as floats (reads the device: call at refresh intervals only)."""
        distributed = self._strategy.world_size > 1
        out: dict[str, float] = {}
        for key, entry in self.values.items():
            if not entry.prog_bar:
                continue
            if entry.on_step and entry.last is not None:
                value = entry.step_value(self._reduce_fn, False, distributed)
                if value is not None:
                    out[entry.step_key] = float(value)
            if entry.on_epoch and (not entry.on_step or self.epoch_done):
                value = entry.epoch_value(self._reduce_fn, False, distributed)
                if value is not None:
                    out[entry.epoch_key] = float(value)
        return out

    def eval_results(self, num_dataloaders: int) -> list[dict[str, float]]:
        """Epoch values per dataloader for validate()/test(): a value logged outside the batches (in
        ``on_validation_epoch_end``, say) appears in every dict, one logged in a batch only in its loader's
        (``add_dataloader_idx=False`` included). Call after :meth:`sync` on every rank."""
        distributed = self._strategy.world_size > 1
        per_loader: list[dict[str, float]] = [{} for _ in range(max(num_dataloaders, 1))]
        for entry in self.values.values():
            if not entry.on_epoch:
                continue
            value = entry.epoch_value(self._reduce_fn, False, distributed)
            if value is None:
                continue
            targets = per_loader if entry.dataloader_idx is None else [per_loader[entry.dataloader_idx]]
            for target in targets:
                target[entry.epoch_key] = float(value)
        return per_loader


def _dtensor_value(value: Any) -> Tensor:
    """A DTensor's value as a plain tensor (a loss under ``loss_parallel()`` is a replicated DTensor): its local
    tensor when replicated, else the whole tensor (a collective: every rank logs it, as the step runs on all)."""
    if all(placement.is_replicate() for placement in value.placements):
        return value.to_local()
    return value.full_tensor()
