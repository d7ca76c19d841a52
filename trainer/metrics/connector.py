"""Where logged values go: ``trainer.callback_metrics``, the progress bar and the loggers.

It also decides *when* values logged with ``sync_dist=True`` (and torchmetrics objects) are reduced across
ranks: only at points every rank reaches together — every ``log_every_n_steps`` optimizer steps, at the end
of a training epoch (after the module's ``on_train_epoch_end``, before callbacks decide anything), and at
the end of an evaluation epoch. Reads in between return the last reduced value or the local one.
"""
from __future__ import annotations

import warnings

from typing import Any, Optional

import torch

from trainer.strategies.rank import rank_zero_only
from trainer.metrics.logged_metrics import ResultCollection


class MetricsConnector:
    """Holds the training/validation result collections and routes their values to their consumers."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.train = self.new_collection("train")
        self.val = self.new_collection("validate")
        self.callback_metrics: dict[str, Any] = {}
        self.logged_metrics: dict[str, Any] = {}
        self.progress_bar_metrics: dict[str, float] = {}

    def new_collection(self, stage: str) -> ResultCollection:
        """A ResultCollection reducing through this Trainer's strategy."""
        return ResultCollection(stage, self.trainer.strategy)

    def reset(self) -> None:
        """Forget what earlier stages logged: each fit/validate/test/predict starts with empty
        ``callback_metrics``, ``logged_metrics`` and ``progress_bar_metrics``, as in Lightning."""
        self.train.reset()
        self.val.reset()
        self.callback_metrics.clear()
        self.logged_metrics.clear()
        self.progress_bar_metrics.clear()

    # ------------------------------------------------------------------ live reads (never collective)
    def read_callback_metrics(self) -> dict[str, Any]:
        """Everything logged so far, refreshed from the running stage."""
        trainer = self.trainer
        results = trainer._results
        if results is None or trainer.sanity_checking:
            return self.callback_metrics
        train = self.train
        if results is not train and train.values and trainer.state_stage == "fit":
            # Validation inside fit: the training step's latest values stay visible, as in Lightning (a
            # ModelCheckpoint monitoring a training value at a mid-epoch validation finds it).
            self.callback_metrics.update(train.callback_metrics(train.epoch_done))
        if results.values:
            self.callback_metrics.update(results.callback_metrics(results.epoch_done))
        return self.callback_metrics

    def read_logged_metrics(self) -> dict[str, Any]:
        """What was sent to the loggers, and the training values logged with ``logger=True`` since (Lightning
        updates ``logged_metrics`` after every training batch, whether or not the loggers were written then)."""
        train = self.train
        if train.values and self.trainer._results is train and not self.trainer.sanity_checking:
            self.logged_metrics.update(train.step_metrics(logger_only=True))
        return self.logged_metrics

    def read_progress_bar_metrics(self) -> dict[str, float]:
        """``prog_bar=True`` values as floats, plus ``skipped_steps`` once the fp16 scaler skipped any."""
        trainer = self.trainer
        results = trainer._results
        if results is not None and not trainer.sanity_checking:
            self.progress_bar_metrics.update(results.prog_bar_metrics())
        if trainer.skipped_steps:
            self.progress_bar_metrics["skipped_steps"] = float(trainer.skipped_steps)
        return self.progress_bar_metrics

    # ------------------------------------------------------------------ sync points (every rank)
    def log_step(self) -> None:
        """At a logging interval: reduce step values, send them to the loggers."""
        self.train.sync(epoch=False)
        metrics = self.train.step_metrics(logger_only=True)
        skipped = self.trainer.skipped_steps
        if skipped:
            metrics["skipped_steps"] = skipped
        self.send(metrics)

    def sync_train_epoch(self) -> None:
        """After the module's ``on_train_epoch_end``: reduce the epoch values before callbacks read them."""
        self.train.sync(epoch=True)

    def log_train_epoch(self) -> None:
        """At the end of a training epoch: keep the epoch values and send them to the loggers."""
        results = self.train
        self.logged_metrics.update(results.step_metrics(logger_only=True))  # the epoch's last step values
        self.callback_metrics.update(results.callback_metrics(epoch_done=True))
        self.progress_bar_metrics.update(results.prog_bar_metrics())
        self.send(results.epoch_metrics(logger_only=True))

    def log_eval_step(self, results: ResultCollection, dataloader_idx: Optional[int]) -> None:
        """After an evaluation batch that logged ``on_step=True`` values: send them at the step that counts this
        loader's evaluation batches (over the whole fit, as Lightning does), without an ``epoch`` key."""
        metrics = results.eval_step_metrics(dataloader_idx)
        seen = results.seen_batches
        index = dataloader_idx or 0
        while len(seen) <= index:
            seen.append(0)
        self.send(metrics, step=seen[index])
        seen[index] += 1

    def finish_eval(self, results: ResultCollection, num_loaders: int, log: bool) -> list[dict[str, float]]:
        """At the end of an evaluation epoch: reduce, keep and log the values; one dict per dataloader."""
        results.sync(epoch=True)
        per_loader = results.eval_results(num_loaders)
        if log:
            self.callback_metrics.update(results.callback_metrics(epoch_done=True))
            self.progress_bar_metrics.update(results.prog_bar_metrics())
            self.send(results.epoch_metrics(logger_only=True))
        return per_loader

    # ------------------------------------------------------------------ loggers (global rank 0 writes)
    def logger_step(self) -> int:
        """The step index loggers record: that of the last optimizer step (0-based, as in Lightning)."""
        return max(self.trainer.fit_loop.progress.batches_that_stepped - 1, 0)

    def send(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        """Record ``metrics`` in ``trainer.logged_metrics`` and write them on global rank 0, as Lightning does:
        ``logger.log_metrics(metrics=..., step=...)`` with keywords. Without an explicit ``step``, a logged
        ``"step"`` value is the step, else the loggers also get the integer ``epoch`` (which stays out of
        ``logged_metrics``) at the last optimizer step."""
        if not metrics:
            return
        trainer = self.trainer
        self.logged_metrics.update(metrics)
        if trainer.loggers and trainer.is_global_zero:
            floats = {k: float(v) for k, v in metrics.items()}
            if step is None:
                logged_step = floats.pop("step", None)
                if logged_step is not None:
                    step = int(logged_step)
                else:
                    floats.setdefault("epoch", trainer.current_epoch)
                    step = self.logger_step()
            for logger in trainer.loggers:
                logger.log_metrics(metrics=floats, step=step)

    @rank_zero_only
    def log_hyperparams(self, model: Any, datamodule: Any) -> None:
        """Send the hyperparameters the module and datamodule saved with ``save_hyperparameters()`` (as first
        saved), then the graph where asked for, then ``logger.save()``, as Lightning does. Those saved with
        ``logger=False``, or never saved, stay out; when neither sends any, ``log_hyperparams`` is not called. A key
        both hold with different values is an error (the logged run would misreport one of them)."""
        sources = [model] + ([datamodule] if datamodule is not None and hasattr(datamodule, "hparams") else [])
        sources = [source for source in sources if getattr(source, "_log_hyperparams", False)]
        params: dict[str, Any] = {}
        for source in sources:
            saved = dict(getattr(source, "hparams_initial", source.hparams))
            clashing = [key for key in saved.keys() & params.keys()
                        if key != "_class_path" and not _same(saved[key], params[key])]  # fmt: skip
            if clashing:
                raise RuntimeError(f"Error while merging hparams: the keys {clashing} are present in both the "
                                   "TrainModule's and DataModule's hparams but have different values. Rename one of "
                                   "them so the logged run records both.")  # fmt: skip
            params.update(saved)
        params.pop("_class_path", None)  # TrainerCLI's bookkeeping, not a hyperparameter
        for logger in self.trainer.loggers:
            if sources:
                logger.log_hyperparams(params)
            logger.log_graph(model)  # a no-op unless the logger was asked to, e.g. TensorBoardLogger(log_graph=True)
            logger.save()

    def finalize(self, status: str) -> None:
        """Close every logger with the run's status. After a failed or interrupted run a logger that cannot close
        (the disk that failed the run is still full) gets a one-line warning: the run's own error is the one raised."""
        if self.trainer.is_global_zero:
            for logger in self.trainer.loggers:
                if status == "success":
                    logger.finalize(status)
                    continue
                try:
                    logger.finalize(status)
                except Exception as err:  # noqa: BLE001 - reported, and the run's error follows
                    warnings.warn(f"{type(logger).__name__} could not be closed after the run {status}: {err}",
                                  stacklevel=2)  # fmt: skip


def _same(a: Any, b: Any) -> bool:
    """Whether two hyperparameter values agree: of one type and equal (tensors: the same object, as comparing them
    is elementwise)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a usable ==: compare identity
        return a is b


def print_eval_results(stage: str, outputs: list[dict[str, float]]) -> None:
    """The table validate()/test() print on global rank 0: one block of metrics per dataloader."""
    for idx, metrics in enumerate(outputs):
        title = f"{stage} metrics" + (f" (dataloader {idx})" if len(outputs) > 1 else "")
        width = max([len(k) for k in metrics] + [len(title)])
        print(title)
        for key, value in sorted(metrics.items()):
            print(f"  {key:<{width}}  {value:.6g}")
