"""``Tuner(trainer)``: run a finder callback in a fit that ends once the search is done, then hand back its result.

``Tuner(trainer).lr_find(model)`` returns the range test's curve (``results``, ``suggestion()``, ``plot()``) and,
with ``update_attr=True``, sets the module's ``lr``/``learning_rate`` (or ``attr_name``) to the suggestion, so
the next ``trainer.fit(model)`` builds its optimizer with it. ``Tuner(trainer).scale_batch_size(model)`` returns
the largest batch size that fits and sets the module's (or datamodule's) ``batch_size``.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from trainer.callbacks.batch_size_finder import BatchSizeFinder
from trainer.callbacks.callback import Callback
from trainer.callbacks.lr_finder import LearningRateFinder, LRFinderResult
from trainer.strategies.errors import ConfigurationError

_METHODS = ("fit", "validate", "test", "predict")


class MissingLearningRateAttribute(ConfigurationError, AttributeError):
    """``lr_find(update_attr=True)`` on a module without the attribute to update: an ``AttributeError`` as in
    Lightning, and our ``ConfigurationError``."""


class Tuner:
    """Finds a learning rate or batch size for ``trainer`` before it trains (Lightning's ``Tuner``)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    def lr_find(
        self,
        model: Any,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: Any = None,
        method: str = "fit",
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        num_training: int = 100,
        mode: str = "exponential",
        early_stop_threshold: Optional[float] = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
        weights_only: Optional[bool] = None,
    ) -> Optional[LRFinderResult]:
        """The learning-rate range test: ``num_training`` steps from ``min_lr`` to ``max_lr``; every effect on the
        model and optimizer is undone. Returns the curve, with ``suggestion()`` and ``plot()``."""
        if method != "fit":
            raise ConfigurationError(f"Tuner.lr_find(method={method!r}): the learning-rate finder trains, so only "
                                     "method='fit' is valid.")  # fmt: skip
        _check_arguments(train_dataloaders, val_dataloaders, dataloaders, method)
        self._refuse_configured(LearningRateFinder)
        if update_attr and not self._trainer.fast_dev_run:  # under fast_dev_run the finder only warns
            attr_name = _lr_attribute(model, attr_name)
        finder = LearningRateFinder(min_lr=min_lr, max_lr=max_lr, num_training_steps=num_training, mode=mode,
                                    early_stop_threshold=early_stop_threshold, update_attr=update_attr,
                                    attr_name=attr_name, weights_only=weights_only)  # fmt: skip
        self._run(finder, "fit", model, train_dataloaders, val_dataloaders, None, datamodule)
        return finder.optimal_lr

    def scale_batch_size(
        self,
        model: Any,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: Any = None,
        method: str = "fit",
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        max_val: Optional[int] = 8192,
        margin: float = 0.05,
        max_memory_mb: Optional[float] = None,
        scale_lr: Union[bool, str] = False,
    ) -> Optional[int]:
        """The largest training batch size that fits: doubling from ``init_val`` (``mode="power"``), then a binary
        search (``"binsearch"``, which keeps ``margin`` below the largest that fitted). Off CUDA, ``max_memory_mb`` bounds the activation memory a batch may use (a CPU
        does not report running out of memory safely). Sets ``batch_arg_name`` on the module or datamodule."""
        _check_arguments(train_dataloaders, val_dataloaders, dataloaders, method)
        if self._trainer.world_size > 1:
            raise ConfigurationError("Tuner.scale_batch_size: tuning the batch size is not supported with distributed "
                                     "strategies (several processes); tune on one device (devices=1), then train.")  # fmt: skip
        self._refuse_configured(BatchSizeFinder)
        finder = BatchSizeFinder(init_val=init_val, max_trials=max_trials, steps_per_trial=steps_per_trial,
                                 max_memory_mb=max_memory_mb, max_val=max_val, scale_lr=scale_lr,
                                 batch_arg_name=batch_arg_name, mode=mode, margin=margin)  # fmt: skip
        self._run(finder, method, model, train_dataloaders, val_dataloaders, dataloaders, datamodule)
        return finder.optimal_batch_size

    def _refuse_configured(self, kind: type) -> None:
        if any(isinstance(callback, kind) for callback in self._trainer.callbacks):
            raise ConfigurationError(
                f"The Trainer already has a {kind.__name__} callback; remove it to use the Tuner (or keep it and "
                "drop the Tuner call: the callback runs at the start of fit)."
            )

    def _run(self, finder: Callback, method: str, model: Any, train_dataloaders: Any, val_dataloaders: Any,
             dataloaders: Any, datamodule: Any) -> None:  # fmt: skip
        trainer = self._trainer
        finder._early_exit = True
        trainer.callbacks = [finder] + list(trainer.callbacks)
        try:
            if method == "fit":
                trainer.fit(model, train_dataloaders, val_dataloaders, datamodule)
            else:  # validate/test/predict: the search runs their steps, from on_validation_start & co.
                getattr(trainer, method)(model, dataloaders, datamodule=datamodule)
        finally:
            trainer.callbacks = [callback for callback in trainer.callbacks if callback is not finder]


def _check_arguments(train_dataloaders: Any, val_dataloaders: Any, dataloaders: Any, method: str) -> None:
    if method not in _METHODS:
        raise ConfigurationError(f"Tuner: method {method!r} is invalid. Should be one of {_METHODS}.")
    if method == "fit" and dataloaders is not None:
        raise ConfigurationError("Tuner with method='fit' trains: `dataloaders` should be None, please consider "
                                 "setting `train_dataloaders` and `val_dataloaders` instead.")  # fmt: skip
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise ConfigurationError(f"Tuner with method={method!r} evaluates: `train_dataloaders` and `val_dataloaders` "
                                 "should be None, please consider setting `dataloaders` instead.")  # fmt: skip


def _lr_attribute(model: Any, attr_name: str) -> str:
    """The module attribute or hyperparameter the suggestion goes to: ``attr_name``, else ``lr`` or
    ``learning_rate``; an error when there is none (the next fit would not use the suggestion)."""
    names = (attr_name,) if attr_name else ("lr", "learning_rate")
    for name in names:
        if name in model.hparams or (hasattr(model, name) and not callable(getattr(model, name))):
            return name
    where = f"`{attr_name}`" if attr_name else "`lr` or `learning_rate`"
    raise MissingLearningRateAttribute(
        f"Tuner.lr_find(update_attr=True) sets the suggestion on the module's {where} (an attribute or a "
        "hyperparameter, read by configure_optimizers): `model` or `model.hparams` should have one of these fields, "
        "and the module has none. Add one, pass attr_name=..., or update_attr=False and read the result's "
        "suggestion()."
    )
