"""Validation and test epochs (hook order in :mod:`trainer.loops.fit_loop`), and prediction."""
from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from trainer.data.batch_transfer import batch_mover
from trainer.data.combined_loader import DataLoaderIter, training_batches
from trainer.metrics.logged_metrics import ResultCollection
from trainer.loops.progress_views import EvalCounts
from trainer.loops.step_signature import step_arity, takes_dataloader_iter
from trainer.module.overrides import overrides
from trainer.module.train_mode import ModuleModes
from trainer.module.train_module import TrainModule

if TYPE_CHECKING:  # pragma: no cover
    from trainer.loops.host import LoopHost

_END = object()


def evaluation_grad_mode(trainer: "LoopHost") -> Any:
    """``torch.inference_mode()`` for evaluation and prediction (``Trainer(inference_mode=True)``, the default),
    else ``torch.no_grad()``. As in Lightning, gloo process groups and sharded strategies get ``no_grad``: their
    collectives and parameter gathering write into tensors that inference mode would make read-only."""
    if trainer.inference_mode and not trainer.strategy.is_sharded:
        distributed = torch.distributed
        if not (distributed.is_available() and distributed.is_initialized() and distributed.get_backend() == "gloo"):
            return torch.inference_mode()
    return torch.no_grad()


class EvaluationLoop:
    """Runs ``validation_step`` or ``test_step`` over one or more dataloaders and reduces the epoch metrics."""

    def __init__(self, trainer: "LoopHost", stage: str, counts: Optional[EvalCounts] = None) -> None:
        self.trainer = trainer
        self.stage = stage  # "validate" or "test"
        self.counts = counts if counts is not None else EvalCounts()  # what ``batch_progress`` views read
        self.prefix = "validation" if stage == "validate" else "test"
        self.step_name = f"{self.prefix}_step"

    def run(
        self,
        loaders: list[Any],
        batch_limits: list[float],
        results: ResultCollection,
        log_to_loggers: bool = True,
        before_end: Optional[Callable[[], None]] = None,
    ) -> list[dict[str, float]]:
        """Run one evaluation epoch; returns one dict of float metrics per dataloader."""
        trainer = self.trainer
        strategy = trainer.strategy
        module = trainer.module
        call_hook = trainer._call_hook
        prefix = self.prefix
        several = len(loaders) > 1
        arity = step_arity(getattr(module, self.step_name), several)  # (batch[, batch_idx[, dataloader_idx]])
        iterator_style = takes_dataloader_iter(getattr(module, self.step_name))
        batch_start = trainer._hooks.caller(trainer, f"on_{prefix}_batch_start")
        batch_end = trainer._hooks.caller(trainer, f"on_{prefix}_batch_end")
        modes = ModuleModes()
        modes.capture(module._running_model())  # each submodule's own mode and the wrapper's, put back after
        counts = self.counts
        counts.start_run()
        previous_results = trainer._results
        trainer._results = results
        results.reset()
        try:
            getattr(module, f"on_{prefix}_model_eval")()  # module.eval() unless the module says otherwise
            with evaluation_grad_mode(trainer):
                results.epoch_level = True
                call_hook(f"on_{prefix}_start")
                call_hook(f"on_{prefix}_epoch_start")
                results.epoch_level = False
                for dataloader_idx, (loader, limit) in enumerate(zip(loaders, batch_limits)):
                    results.dataloader_idx = dataloader_idx if several else None
                    iterator = training_batches(loader)  # a CombinedLoader: its combined batches
                    if iterator_style:
                        run_iterator_style(strategy, self.step_name, DataLoaderIter(iterator, limit, dataloader_idx),
                                           batch_start, batch_end)  # fmt: skip
                        continue
                    to_device = batch_mover(trainer, dataloader_idx)
                    # As Lightning, the batch hooks get dataloader_idx only when there are several loaders (a hook
                    # written as (batch, batch_idx) works with one).
                    idx = (dataloader_idx,) if several else ()
                    batch_idx = 0
                    while batch_idx < limit:
                        batch = next(iterator, _END)
                        if batch is _END:
                            break
                        if to_device is not None:
                            batch = to_device(batch)
                        results.batch = batch  # its size is inferred only if a logged value needs it
                        if batch_start is not None:
                            batch_start(batch, batch_idx, *idx)
                        args = (batch, batch_idx, dataloader_idx)[:arity]
                        outputs = strategy.evaluation_step(self.step_name, *args)
                        if batch_end is not None:
                            batch_end(outputs, batch, batch_idx, *idx)
                        if log_to_loggers and results.has_step_values:
                            trainer._metrics.log_eval_step(results, results.dataloader_idx)
                        batch_idx += 1
                        counts.current += 1
                        counts.total += 1
                results.dataloader_idx = None
                counts.is_last_batch = True
                results.epoch_level = True
                results.epoch_done = True
                call_hook(f"on_{prefix}_epoch_end")
                per_loader = trainer._metrics.finish_eval(results, len(loaders), log_to_loggers)
                if before_end is not None:
                    before_end()
                call_hook(f"on_{prefix}_end")
                if trainer._val_check_seconds is not None:  # a time-based val_check_interval counts from here
                    trainer._last_val_time = time.monotonic()
        finally:
            train_hook = f"on_{prefix}_model_train"
            if overrides(module, TrainModule, train_hook):  # as in Lightning: the module's own hook decides
                getattr(module, train_hook)()
            else:
                modes.restore()
            trainer._results = previous_results
        return per_loader


class PredictionLoop:
    """Runs ``predict_step`` over one or more dataloaders and returns the outputs."""

    def __init__(self, trainer: "LoopHost", counts: Optional[EvalCounts] = None) -> None:
        self.trainer = trainer
        self.counts = counts if counts is not None else EvalCounts()  # what ``batch_progress`` views read

    def run(self, loaders: list[Any], batch_limits: list[float], return_predictions: bool = True) -> Any:
        """One list of outputs per dataloader (a flat list when there is one dataloader)."""
        module = self.trainer.module
        modes = ModuleModes()
        modes.capture(module._running_model())
        module.on_predict_model_eval()
        try:
            all_outputs = self._run(loaders, batch_limits, return_predictions)
        finally:
            modes.restore()
        if not return_predictions:
            return None
        return all_outputs[0] if len(all_outputs) == 1 else all_outputs

    def _run(self, loaders: list[Any], batch_limits: list[float], return_predictions: bool) -> list[list[Any]]:
        trainer = self.trainer
        strategy = trainer.strategy
        module = trainer.module
        call_hook = trainer._call_hook
        several = len(loaders) > 1
        arity = step_arity(module.predict_step, several)
        iterator_style = takes_dataloader_iter(module.predict_step)
        all_outputs: list[list[Any]] = []
        warned_none = False
        counts = self.counts
        counts.start_run()
        with evaluation_grad_mode(trainer):
            call_hook("on_predict_start")
            call_hook("on_predict_epoch_start")
            for dataloader_idx, (loader, limit) in enumerate(zip(loaders, batch_limits)):
                outputs: list[Any] = []
                iterator = training_batches(loader)  # a CombinedLoader: its combined batches
                if iterator_style:
                    def batch_end(prediction: Any, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
                        call_hook("on_predict_batch_end", prediction, batch, batch_idx, dataloader_idx)
                        if return_predictions:
                            outputs.append(prediction)

                    run_iterator_style(strategy, "predict_step", DataLoaderIter(iterator, limit, dataloader_idx),
                                       lambda *args: call_hook("on_predict_batch_start", *args), batch_end)  # fmt: skip
                    all_outputs.append(outputs)
                    continue
                to_device = batch_mover(trainer, dataloader_idx)
                idx = (dataloader_idx,) if several else ()  # as for validation and test
                batch_idx = 0
                while batch_idx < limit:
                    batch = next(iterator, _END)
                    if batch is _END:
                        break
                    if to_device is not None:
                        batch = to_device(batch)
                    call_hook("on_predict_batch_start", batch, batch_idx, *idx)
                    args = (batch, batch_idx, dataloader_idx)[:arity]
                    prediction = strategy.evaluation_step("predict_step", *args)
                    if prediction is None and not warned_none:  # once per run, as Lightning
                        warned_none = True
                        warnings.warn(f"predict returned None (predict_step of batch {batch_idx}); if it was on "
                                      "purpose, ignore this warning. The predictions list holds None there.",
                                      UserWarning, stacklevel=2)  # fmt: skip
                    call_hook("on_predict_batch_end", prediction, batch, batch_idx, *idx)
                    if return_predictions:
                        outputs.append(prediction)
                    batch_idx += 1
                    counts.current += 1
                    counts.total += 1
                all_outputs.append(outputs)
            counts.is_last_batch = True
            call_hook("on_predict_epoch_end")
            call_hook("on_predict_end")
        return all_outputs


def run_iterator_style(strategy: Any, step_name: str, dataloader_iter: DataLoaderIter, batch_start: Any,
                       batch_end: Any) -> None:  # fmt: skip
    """``validation_step``/``test_step``/``predict_step(self, dataloader_iter)``: called until the loader is done;
    the step takes the batches (and moves them). The batch hooks see the batch the step last took (``None`` before
    the first), as in Lightning."""
    loader_idx = dataloader_iter.dataloader_idx
    while not dataloader_iter.done:
        before = dataloader_iter.fetched
        if batch_start is not None:
            batch_start(dataloader_iter.batch, before, loader_idx)
        try:
            outputs = strategy.evaluation_step(step_name, dataloader_iter)
        except StopIteration:  # the step asked for more than was left
            break
        if dataloader_iter.fetched == before:
            raise RuntimeError(
                f"{step_name}(dataloader_iter) returned without taking a batch (next(dataloader_iter)); it would be "
                "called forever. Take at least one batch per call."
            )
        if batch_end is not None:
            batch_end(outputs, dataloader_iter.batch, dataloader_iter.fetched - 1, loader_idx)
