"""Validation and test epochs (hook order in :mod:`trainer.loops.fit_loop`), and prediction."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from trainer.data.batch_transfer import batch_mover
from trainer.metrics.logged_metrics import ResultCollection
from trainer.loops.step_signature import step_arity

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

    def __init__(self, trainer: "LoopHost", stage: str) -> None:
        self.trainer = trainer
        self.stage = stage  # "validate" or "test"
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
        batch_start = trainer._hooks.caller(trainer, f"on_{prefix}_batch_start")
        batch_end = trainer._hooks.caller(trainer, f"on_{prefix}_batch_end")
        was_training = module.training
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
                    iterator = iter(loader)
                    to_device = batch_mover(trainer, dataloader_idx)
                    batch_idx = 0
                    while batch_idx < limit:
                        batch = next(iterator, _END)
                        if batch is _END:
                            break
                        if to_device is not None:
                            batch = to_device(batch)
                        results.batch = batch  # its size is inferred only if a logged value needs it
                        if batch_start is not None:
                            batch_start(batch, batch_idx, dataloader_idx)
                        args = (batch, batch_idx, dataloader_idx)[:arity]
                        outputs = strategy.evaluation_step(self.step_name, *args)
                        if batch_end is not None:
                            batch_end(outputs, batch, batch_idx, dataloader_idx)
                        if log_to_loggers and results.has_step_values:
                            trainer._metrics.log_eval_step(results, results.dataloader_idx)
                        batch_idx += 1
                results.dataloader_idx = None
                results.epoch_level = True
                results.epoch_done = True
                call_hook(f"on_{prefix}_epoch_end")
                per_loader = trainer._metrics.finish_eval(results, len(loaders), log_to_loggers)
                if before_end is not None:
                    before_end()
                call_hook(f"on_{prefix}_end")
        finally:
            if was_training:
                getattr(module, f"on_{prefix}_model_train")()
            trainer._results = previous_results
        return per_loader


class PredictionLoop:
    """Runs ``predict_step`` over one or more dataloaders and returns the outputs."""

    def __init__(self, trainer: "LoopHost") -> None:
        self.trainer = trainer

    def run(self, loaders: list[Any], batch_limits: list[float], return_predictions: bool = True) -> Any:
        """One list of outputs per dataloader (a flat list when there is one dataloader)."""
        trainer = self.trainer
        strategy = trainer.strategy
        module = trainer.module
        call_hook = trainer._call_hook
        several = len(loaders) > 1
        arity = step_arity(module.predict_step, several)
        all_outputs: list[list[Any]] = []
        module.on_predict_model_eval()
        with evaluation_grad_mode(trainer):
            call_hook("on_predict_start")
            call_hook("on_predict_epoch_start")
            for dataloader_idx, (loader, limit) in enumerate(zip(loaders, batch_limits)):
                outputs: list[Any] = []
                iterator = iter(loader)
                to_device = batch_mover(trainer, dataloader_idx)
                batch_idx = 0
                while batch_idx < limit:
                    batch = next(iterator, _END)
                    if batch is _END:
                        break
                    if to_device is not None:
                        batch = to_device(batch)
                    call_hook("on_predict_batch_start", batch, batch_idx, dataloader_idx)
                    args = (batch, batch_idx, dataloader_idx)[:arity]
                    prediction = strategy.evaluation_step("predict_step", *args)
                    call_hook("on_predict_batch_end", prediction, batch, batch_idx, dataloader_idx)
                    if return_predictions:
                        outputs.append(prediction)
                    batch_idx += 1
                all_outputs.append(outputs)
            call_hook("on_predict_epoch_end")
            call_hook("on_predict_end")
        if not return_predictions:
            return None
        return all_outputs[0] if len(all_outputs) == 1 else all_outputs
