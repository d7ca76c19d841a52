"""``TrainModule``: a ``torch.nn.Module`` that holds the science (steps, optimizers, hooks).

A Lightning user renames ``LightningModule`` to ``TrainModule``; the hooks and methods keep their names.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError
from trainer.module.hparams import AttributeDict, hyperparameters_of_call
from trainer.module.train_mode import ModuleModes
from trainer.module.overrides import overrides



def _outside_dynamo(method: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.disable(method)``, made on the first call: decorating at import time would load Dynamo
    (about a second) for every ``import trainer``. A first call inside a compiled function breaks the graph there,
    which is what the disable is for."""
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not disabled:
            disabled.append(torch.compiler.disable(method))
        return disabled[0](*args, **kwargs)

    return call


class TrainModule(nn.Module):
    """Subclass this and implement ``training_step`` and ``configure_optimizers``; the Trainer does the rest.

    Hooks are no-ops by default; :mod:`trainer.loops.fit_loop` documents the order in which they run.
    """

    #: An example batch for ``forward`` (used by ``to_torchscript``/``to_onnx`` and ``trainer estimate-memory``).
    example_input_array: Any = None
    #: ``prepare_data`` runs on local rank 0 of every node (True) or on global rank 0 only (False).
    prepare_data_per_node: bool = True
    #: Whether restoring a checkpoint in fit/validate/test requires every weight to match (Lightning's attribute).
    strict_loading: bool = True
    #: Properties TorchScript must not compile (they read the Trainer): ``torch.jit.script(module)`` works before
    #: and after ``fit``, as in Lightning.
    __jit_unused_properties__: list[str] = [
        "trainer", "device", "dtype", "current_epoch", "global_step", "global_rank", "local_rank", "on_gpu",
        "logger", "loggers", "device_mesh", "hparams", "hparams_initial",
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Any = None
        self._hparams: AttributeDict = AttributeDict()
        self._hparams_initial: AttributeDict = AttributeDict()
        self.automatic_optimization: bool = True

    def __getattr__(self, name: str) -> Any:
        # nn.Module keeps submodules out of __dict__, so ``self.model`` in a training_step ends here; its own
        # __getattr__ looks in parameters and buffers first. A name lives in only one of the three, so looking at
        # submodules first finds the same object in fewer steps (a small but per-step cost a raw loop does not pay).
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            return modules[name]
        return super().__getattr__(name)

    # ------------------------------------------------------------------ properties set by the trainer
    @property
    def trainer(self) -> Any:
        """The Trainer running this module (raises when the module is not attached to one)."""
        if self._trainer is None and not self.__dict__.get("_jit_is_scripting"):
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call trainer.fit(module) first.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Any) -> None:
        object.__setattr__(self, "_trainer", trainer)

    @property
    def device(self) -> torch.device:
        """Device of the module's first parameter (or buffer); CPU for a module without either."""
        for tensor in self.parameters():
            return tensor.device
        for tensor in self.buffers():
            return tensor.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the module's first floating parameter."""
        for tensor in self.parameters():
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    @property
    def current_epoch(self) -> int:
        """Current epoch (0-based); 0 when not attached."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far; 0 when not attached."""
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:
        """Rank of this process in the whole job."""
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node."""
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def on_gpu(self) -> bool:
        """True when the module's parameters are on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def logger(self) -> Any:
        """The Trainer's first logger (``self.logger.experiment`` is e.g. the TensorBoard writer); None if none."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Any]:
        """Every logger of the Trainer (empty when not attached or ``logger=False``)."""
        return list(self._trainer.loggers) if self._trainer is not None else []

    @property
    def device_mesh(self) -> Any:
        """The strategy's ``DeviceMesh`` (e.g. ``self.device_mesh["tp"]`` in :meth:`configure_model`); ``None`` when
        the strategy has none or the module is not attached to a Trainer."""
        return self._trainer.strategy.device_mesh if self._trainer is not None else None

    @property
    def hparams(self) -> AttributeDict:
        """Hyperparameters recorded by :meth:`save_hyperparameters` (saved in checkpoints)."""
        return self._hparams

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as first recorded."""
        return copy.deepcopy(self._hparams_initial)

    # ------------------------------------------------------------------ steps (override)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Inference forward; ``predict_step`` calls it by default."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented.")

    forward._not_implemented = True  # type: ignore[attr-defined]  # compile= refuses a module without its own forward

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Return a loss tensor, a dict with key ``"loss"``, or ``None`` to skip this batch's optimizer step."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_step(batch, batch_idx).")

    def validation_step(self, batch: Any, batch_idx: int, *args: Any) -> Any:
        """One validation batch; log metrics with :meth:`log`."""

    def test_step(self, batch: Any, batch_idx: int, *args: Any) -> Any:
        """One test batch; log metrics with :meth:`log`."""

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """One prediction batch; defaults to ``self(batch)``."""
        return self(batch)

    def configure_optimizers(self) -> Any:
        """Return an optimizer, ``([optimizers], [schedulers])``, or ``{"optimizer": ..., "lr_scheduler": ...}``."""
        raise NotImplementedError(f"{type(self).__name__} must implement configure_optimizers().")

    def configure_model(self) -> None:
        """Build layers here instead of in ``__init__`` for deferred initialisation, and apply a tensor-parallel
        plan (``parallelize_module(..., self.device_mesh["tp"], ...)``) or ``fully_shard`` yourself.

        Called once per module, by the first stage (fit/validate/test/predict) that runs it, inside the strategy's
        init context (the ``meta`` device under sharded strategies) and before the strategy wraps the module.
        Lightning calls it every stage and asks it to be idempotent; calling it once does the same for such a
        hook and never replaces trained layers.
        """

    def configure_callbacks(self) -> Union[Iterable[Any], Any]:
        """Callbacks this module needs; added to (and replacing same-type) Trainer callbacks."""
        return []

    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: Optional[float] = None, gradient_clip_algorithm: Optional[str] = None
    ) -> None:
        """Clip gradients before the step; by default applies the Trainer's ``gradient_clip_val``."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

    # ------------------------------------------------------------------ data hooks (optional)
    def prepare_data(self) -> None:
        """Download or write data to disk, once per node (see ``prepare_data_per_node``) before ``setup``."""

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device``; override for batch types the default walk does not know."""
        from trainer.strategies.strategy import move_to_device

        return move_to_device(batch, device)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (e.g. CPU augmentation); return the batch."""
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch on the device (e.g. GPU augmentation); return the batch."""
        return batch

    def train_dataloader(self) -> Any:
        """Training data, used when none is passed to ``fit``."""
        return None

    def val_dataloader(self) -> Any:
        """Validation data, used when none is passed to ``fit``/``validate``."""
        return None

    def test_dataloader(self) -> Any:
        """Test data, used when none is passed to ``test``."""
        return None

    def predict_dataloader(self) -> Any:
        """Prediction data, used when none is passed to ``predict``."""
        return None

    def tokens_in_batch(self, batch: Any) -> Optional[int]:
        """Tokens a training batch holds, for ``ThroughputMonitor``'s tokens/s (``None``: not a token model).
        E.g. ``return batch[0].numel()`` for ``(ids, targets)`` batches of shape (batch, context)."""
        return None

    # ------------------------------------------------------------------ hooks (no-ops)
    def setup(self, stage: str) -> None:
        """Called at the start of fit/validate/test/predict on every process (``stage`` names which)."""

    def teardown(self, stage: str) -> None:
        """Called at the end of fit/validate/test/predict."""

    def on_fit_start(self) -> None:
        """Called at the very beginning of fit."""

    def on_fit_end(self) -> None:
        """Called at the very end of fit."""

    def on_train_start(self) -> None:
        """Called when the training loop begins (after the sanity check)."""

    def on_train_end(self) -> None:
        """Called when the training loop ends."""

    def on_train_epoch_start(self) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self) -> None:
        """Called at the end of each training epoch (after its validation)."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Optional[int]:
        """Called before ``training_step``; return ``-1`` to skip the rest of the epoch."""
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after the micro-batch (and the optimizer step when the window completed)."""

    def on_validation_start(self) -> None:
        """Called when a validation run begins."""

    def on_validation_end(self) -> None:
        """Called when a validation run ends."""

    def on_validation_epoch_start(self) -> None:
        """Called at the start of a validation epoch."""

    def on_validation_epoch_end(self) -> None:
        """Called at the end of a validation epoch."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``validation_step``."""

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``validation_step``."""

    def on_test_start(self) -> None:
        """Called when a test run begins."""

    def on_test_end(self) -> None:
        """Called when a test run ends."""

    def on_test_epoch_start(self) -> None:
        """Called at the start of the test epoch."""

    def on_test_epoch_end(self) -> None:
        """Called at the end of the test epoch."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``test_step``."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``test_step``."""

    def on_predict_start(self) -> None:
        """Called when a predict run begins."""

    def on_predict_end(self) -> None:
        """Called when a predict run ends."""

    def on_predict_epoch_start(self) -> None:
        """Called at the start of the predict epoch."""

    def on_predict_epoch_end(self) -> None:
        """Called at the end of the predict epoch."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``predict_step``."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``predict_step``."""

    def backward_context(self) -> contextlib.AbstractContextManager:
        """A context the training loop enters around ``training_step`` and the backward of its loss (each
        micro-batch; with manual optimisation, around ``training_step``, which calls ``manual_backward``). Not
        overridden: nothing is entered. For tensor parallel's loss parallel (logits left sharded over the
        vocabulary, as torchtitan's plan does; torch needs the loss and its backward inside the context)::

            from torch.distributed.tensor.parallel import loss_parallel

            def backward_context(self):
                return loss_parallel() if self.device_mesh is not None else contextlib.nullcontext()
        """
        return contextlib.nullcontext()

    def on_before_backward(self, loss: Tensor) -> None:
        """Called before ``backward`` with the (accumulation-scaled) loss."""

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of the loss ``training_step`` returned (automatic optimisation) or ``manual_backward`` was
        given; override for a backward of your own. ``loss`` is divided by ``accumulate_grad_batches`` and scaled
        where the precision scales (16-mixed); ``args``/``kwargs`` are ``manual_backward``'s. Called between
        ``on_before_backward`` and ``on_after_backward``, only when overridden (else the strategy runs it); with
        ``strategy="deepspeed"`` the engine runs the backward and the override is not called::

            def backward(self, loss):
                loss.backward(retain_graph=True)
        """
        loss.backward(*args, **kwargs)

    def on_after_backward(self) -> None:
        """Called after ``backward``; gradients may still be scaled under 16-mixed."""

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        """Called before the optimizer step with true (unscaled), not-yet-clipped gradients."""

    def on_before_zero_grad(self, optimizer: Optimizer) -> None:
        """Called after the optimizer step, before gradients are cleared."""

    def on_validation_model_zero_grad(self) -> None:
        """Called by ``fit`` before a validation that follows an optimizer step, to release the gradients (as in
        Lightning); not called where the loop already cleared them right after the step."""
        self.zero_grad()

    def _running_model(self) -> nn.Module:
        """``trainer.model`` (the strategy's wrapper, e.g. DDP's, around this module) when attached, else the module:
        what the mode hooks below switch, as Lightning's switch ``self.trainer.model``."""
        trainer = self._trainer
        model = getattr(trainer, "model", None) if trainer is not None else None
        return model if isinstance(model, nn.Module) else self

    def on_validation_model_eval(self) -> None:
        """Put ``trainer.model`` (the module, and the strategy's wrapper around it) in evaluation mode for
        validation (override to keep e.g. dropout on)."""
        self._running_model().eval()

    def on_validation_model_train(self) -> None:
        """Called after validation only when overridden; otherwise each submodule (and the strategy's wrapper) gets
        back the train/eval mode it had before validation (as in Lightning)."""
        self._running_model().train()

    def on_test_model_eval(self) -> None:
        """Put ``trainer.model`` in evaluation mode for test."""
        self._running_model().eval()

    def on_test_model_train(self) -> None:
        """Called after test only when overridden; otherwise each submodule gets back the mode it had before."""
        self._running_model().train()

    def on_predict_model_eval(self) -> None:
        """Put ``trainer.model`` in evaluation mode for predict."""
        self._running_model().eval()

    # ------------------------------------------------------------------ optimisation hooks (automatic optimisation)
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Optional[Callable] = None) -> None:
        """Step ``optimizer`` at the end of an accumulation window; override to act around it (e.g. a learning-rate
        warm-up) and call ``optimizer.step(closure=optimizer_closure)``. As in Lightning the closure runs this
        micro-batch's ``training_step`` and backward; ``optimizer.step`` then runs the precision plugin,
        ``on_before_optimizer_step`` and clipping. ``optimizer_closure()`` alone skips the step."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Clear the gradients; called after the first ``training_step`` of an accumulation window, before its
        backward, as in Lightning (override e.g. to keep them as zeros: ``set_to_none=False``)."""
        optimizer.zero_grad(set_to_none=True)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step one LR scheduler (``metric`` for ReduceLROnPlateau); override for schedulers with another ``step``
        signature (e.g. timm's ``step(epoch)``)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add or edit entries of a checkpoint being saved."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read entries of a checkpoint being restored."""

    # ------------------------------------------------------------------ logging
    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: Optional[bool] = None,
        on_step: Optional[bool] = None,
        on_epoch: Optional[bool] = None,
        reduce_fx: Union[str, Callable] = "mean",
        sync_dist: bool = False,
        batch_size: Optional[int] = None,
        add_dataloader_idx: bool = True,
        *,
        enable_graph: bool = False,
        sync_dist_group: Any = None,
        metric_attribute: Optional[str] = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record a metric: a number, a scalar tensor or a ``torchmetrics.Metric``.

        Defaults: in training ``on_step=True, on_epoch=False``; in validation/test and in epoch-level hooks
        ``on_step=False, on_epoch=True``. Epoch values are means weighted by batch size (or ``reduce_fx``).
        Tensors are detached (no graph is kept) and read on the host only at logging intervals. ``logger=None``
        (the default) sends the value to the loggers; an explicit ``logger=True`` with no logger attached warns, as
        in Lightning. ``enable_graph``, ``sync_dist_group``, ``metric_attribute`` and ``rank_zero_only`` are Lightning's and
        accepted so its calls run: values are always detached, ``sync_dist`` reduces over all ranks, and loggers write
        from global rank 0.
        """
        results = self._trainer._results if self._trainer is not None else None
        if results is None:
            if not self.__dict__.get("_log_warned"):
                self.__dict__["_log_warned"] = True  # once per module, not per call
                _warn_not_attached(name, self._trainer)
            return
        if logger is None:
            logger = True
        elif logger and name not in self.__dict__.get("_told_no_logger", ()) and self._trainer.logger is None:
            self.__dict__.setdefault("_told_no_logger", set()).add(name)  # once per name, not per call
            warnings.warn(f"You called `self.log({name!r}, ..., logger=True)` but have no logger configured. Attach "
                          "one with `Trainer(logger=...)`, or drop logger=True.", UserWarning, stacklevel=2)
        if metric_attribute is None and _is_torchmetric(value):
            self._check_metric_attribute(name, value)
        results.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size, add_dataloader_idx)

    def _check_metric_attribute(self, name: str, metric: Any) -> None:
        """A logged ``torchmetrics.Metric`` must be one of the module's attributes: the loop resets it at each epoch's
        end and moves and syncs it with the module; one created on the fly would silently keep its old state."""
        attributes = self.__dict__.get("_metric_attributes")
        if attributes is None or id(metric) not in attributes:
            attributes = {id(module): path for path, module in self.named_modules() if _is_torchmetric(module)}
            self.__dict__["_metric_attributes"] = attributes
        if id(metric) not in attributes:
            raise ConfigurationError(
                f"Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged as {name!r}: "
                "the loop resets and syncs only the metrics the module holds. Assign it in __init__ "
                f"(self.accuracy = Accuracy(...); self.log({name!r}, self.accuracy)), or pass "
                f"self.log({name!r}, ..., metric_attribute=<attribute name>)"
                + (f"; the module's metrics are {sorted(attributes.values())}." if attributes else ".")
            )

    def log_dict(
        self,
        dictionary: Mapping[str, Any],
        prog_bar: bool = False,
        logger: Optional[bool] = None,
        on_step: Optional[bool] = None,
        on_epoch: Optional[bool] = None,
        reduce_fx: Union[str, Callable] = "mean",
        sync_dist: bool = False,
        batch_size: Optional[int] = None,
        add_dataloader_idx: bool = True,
        *,
        enable_graph: bool = False,
        sync_dist_group: Any = None,
        rank_zero_only: bool = False,
    ) -> None:
        """:meth:`log` every item of ``dictionary`` (or a torchmetrics ``MetricCollection``) with the same options."""
        items = dictionary.items()
        if hasattr(dictionary, "compute") and hasattr(dictionary, "keys"):  # MetricCollection: log each metric
            items = [(k, m) for k, m in dictionary.items(keep_base=False, copy_state=False)]
        for name, value in items:
            self.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size, add_dataloader_idx)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` from global rank 0 only."""
        if self.global_rank == 0:
            print(*args, **kwargs)

    # ------------------------------------------------------------------ manual optimisation
    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer from ``configure_optimizers`` (a list when there are several), wrapped so ``step()`` runs
        through the strategy and precision plugin, with ``.optimizer``, ``.param_groups``, ``.zero_grad()``; in
        automatic and manual optimisation alike, as Lightning's ``LightningOptimizer``. ``use_pl_optimizer=False``:
        the torch optimizers themselves."""
        optimizers = self.trainer._wrapped_optimizers if use_pl_optimizer else self.trainer.optimizers
        return optimizers[0] if len(optimizers) == 1 else optimizers

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from ``configure_optimizers`` (``None`` when there are none)."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward for manual optimisation: loss scaling and hooks as in automatic mode; ``args``/``kwargs`` go to
        ``Tensor.backward`` (e.g. ``retain_graph=True``)."""
        trainer = self.trainer
        if self.automatic_optimization:
            raise ConfigurationError(
                "manual_backward is for manual optimisation: set self.automatic_optimization = False in __init__."
            )
        trainer._call_hook("on_before_backward", loss)
        if overrides(self, TrainModule, "backward"):
            trainer.strategy.backward_through(self.backward, loss, *args, **kwargs)
        else:
            trainer.strategy.backward(loss, *args, **kwargs)
        trainer._call_hook("on_after_backward")

    @_outside_dynamo  # it flips requires_grad, which Dynamo cannot trace (a compiled step graph-breaks here)
    def toggle_optimizer(self, optimizer: Any) -> None:
        """Compute gradients only for ``optimizer``'s parameters until :meth:`untoggle_optimizer` (e.g. a GAN's
        generator step): the parameters only the other optimizers hold get ``requires_grad=False``."""
        from trainer.module.optimizer_toggle import toggle

        self.__dict__["_toggled_requires_grad"] = toggle(optimizer, self.trainer.optimizers)

    @_outside_dynamo
    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Undo :meth:`toggle_optimizer`: every ``requires_grad`` flag is as it was before the toggle."""
        from trainer.module.optimizer_toggle import untoggle

        untoggle(self.__dict__.pop("_toggled_requires_grad", {}))

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """``with self.toggled_optimizer(opt):`` :meth:`toggle_optimizer` on entry, :meth:`untoggle_optimizer` on exit."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(
        self, optimizer: Optimizer, gradient_clip_val: Optional[float] = None, gradient_clip_algorithm: Optional[str] = None
    ) -> None:
        """Clip gradients of ``optimizer``'s parameters by norm (default) or value; unscales first under 16-mixed.
        An argument not given is the Trainer's (``gradient_clip_val``/``gradient_clip_algorithm``); one that
        contradicts a value set on the Trainer is refused."""
        trainer = self.trainer
        configured_val = getattr(trainer, "gradient_clip_val", None)
        if gradient_clip_val is None:
            gradient_clip_val = configured_val
        elif configured_val is not None and float(gradient_clip_val) != configured_val:
            raise ConfigurationError(
                f"You have set `Trainer(gradient_clip_val={configured_val!r})` and have passed "
                f"`clip_gradients(gradient_clip_val={gradient_clip_val!r})`. Please use only one of them: "
                f"clip_gradients(gradient_clip_val={gradient_clip_val}) contradicts Trainer(gradient_clip_val="
                f"{configured_val}); set the value in one place."
            )
        configured_algorithm = getattr(trainer, "gradient_clip_algorithm", None)
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = configured_algorithm
        elif configured_algorithm is not None and gradient_clip_algorithm.lower() != configured_algorithm:
            raise ConfigurationError(
                f"You have set `Trainer(gradient_clip_algorithm={configured_algorithm!r})` and have passed "
                f"`clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r})`. Please use only one of them: "
                f"clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r}) contradicts Trainer("
                f"gradient_clip_algorithm={configured_algorithm!r}); set it in one place."
            )
        if gradient_clip_val is None or gradient_clip_val == 0:
            return
        algorithm = (gradient_clip_algorithm or "norm").lower()
        if algorithm not in ("norm", "value"):
            raise ConfigurationError(f"`gradient_clip_algorithm` {algorithm} is invalid. Allowed algorithms: "
                                     "['value', 'norm'] (gradient_clip_algorithm='norm' or 'value').")  # fmt: skip
        for wrapped in self.trainer._wrapped_optimizers:
            if optimizer is wrapped:
                # The gradient scaler tracks "unscaled already" per optimizer object: it must see the one step() uses.
                optimizer = wrapped.optimizer
        self.trainer.strategy.clip_gradients(optimizer, float(gradient_clip_val), algorithm)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Gather tensors (also inside lists, tuples and dicts) from every process: each gets a new leading dimension
        of size world size. ``sync_grads=True`` lets gradients flow back through the gather."""
        from trainer.module.collectives import all_gather_tree

        return all_gather_tree(data, self.trainer.strategy, group, sync_grads)

    def freeze(self) -> "TrainModule":
        """No gradients for any parameter, and evaluation mode; returns the module (``model.freeze()(x)``)."""
        for param in self.parameters():
            param.requires_grad_(False)
        return self.eval()

    def unfreeze(self) -> "TrainModule":
        """Gradients for every parameter again, and training mode; returns the module."""
        for param in self.parameters():
            param.requires_grad_(True)
        return self.train()

    def to_torchscript(self, file_path: Optional[Union[str, Path]] = None, method: str = "script",
                       example_inputs: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """A TorchScript version of the module (``torch.jit.script``, or ``method="trace"`` with ``example_inputs``,
        default ``example_input_array``); saved to ``file_path`` when given."""
        modes = ModuleModes()
        modes.capture(self)  # each submodule's own mode comes back after the export
        self.eval()
        self.__dict__["_jit_is_scripting"] = True  # TorchScript reads every property, ``trainer`` too
        try:
            if method == "script":
                scripted = torch.jit.script(self, **kwargs)
            elif method == "trace":
                inputs = self.example_input_array if example_inputs is None else example_inputs
                if inputs is None:
                    raise ConfigurationError("to_torchscript(method='trace') needs example_inputs or example_input_array.")
                scripted = torch.jit.trace(self, inputs, **kwargs)
            else:
                raise ConfigurationError(f"to_torchscript(method={method!r}): use 'script' or 'trace'.")
        finally:
            self.__dict__.pop("_jit_is_scripting", None)
            modes.restore()
        if file_path is not None:
            torch.jit.save(scripted, str(file_path))
        return scripted

    def to_onnx(self, file_path: Union[str, Path], input_sample: Any = None, **kwargs: Any) -> None:
        """Export ``forward`` to ONNX with ``torch.onnx.export`` (``input_sample`` defaults to ``example_input_array``)."""
        inputs = self.example_input_array if input_sample is None else input_sample
        if inputs is None:
            raise ConfigurationError("to_onnx needs input_sample or example_input_array.")
        modes = ModuleModes()
        modes.capture(self)
        self.eval()
        try:
            torch.onnx.export(self, inputs if isinstance(inputs, tuple) else (inputs,), str(file_path), **kwargs)
        finally:
            modes.restore()

    # ------------------------------------------------------------------ hyperparameters and checkpoints
    def save_hyperparameters(
        self, *args: Any, ignore: Optional[Union[str, Iterable[str]]] = None, frame: Any = None, logger: bool = True
    ) -> None:
        """Record the ``__init__`` arguments (all, or those named in ``args``) in ``self.hparams``.

        Values must be plain Python values or tensors so checkpoints stay safe to load; others are skipped
        with a warning (pass them again to ``load_from_checkpoint`` as overrides). ``logger=False`` keeps them
        out of the loggers' ``log_hyperparams`` (they are still saved in checkpoints), as in Lightning.
        """
        self._log_hyperparams = logger
        caller = frame or inspect.currentframe().f_back
        self._hparams.update(hyperparameters_of_call(self, caller, args, ignore))
        self._hparams_initial = copy.deepcopy(self._hparams)

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: Union[str, Path],
        map_location: Any = None,
        strict: bool = True,
        **overrides: Any,
    ) -> "TrainModule":
        """Rebuild the module from the hyperparameters in a checkpoint (``overrides`` win) and load its weights."""
        from trainer.module.saving import load_module_from_checkpoint

        return load_module_from_checkpoint(cls, checkpoint_path, map_location, strict, overrides)


def configure_model_once(module: TrainModule, strategy: Any, check_init: bool = False) -> Optional[dict]:
    """Build the module the first time a stage runs: ``configure_model()`` then, if the module defines it,
    ``init_weights()`` (under ``no_grad``), in the strategy's init context (``Strategy.build_module``: on ``meta``
    and replayed per shard under sharded strategies). Returns the eager reference tensors when ``check_init``."""
    if type(module).configure_model is TrainModule.configure_model or module.__dict__.get("_model_configured"):
        return None

    def build() -> None:
        module.configure_model()
        init_weights = getattr(module, "init_weights", None)
        if callable(init_weights):
            with torch.no_grad():
                init_weights()

    reference = strategy.build_module(module, build, check_init)
    module.__dict__["_model_configured"] = True
    return reference


def _is_torchmetric(value: Any) -> bool:
    # torchmetrics is looked up only if the user imported it: no import cost for users without metrics.
    module = sys.modules.get("torchmetrics")
    return module is not None and isinstance(value, module.Metric)


def _warn_not_attached(name: str, trainer: Any) -> None:
    if trainer is None:
        why = "on a module that is not run by a Trainer"
    elif trainer.state_stage is not None:  # set-up: setup, configure_model, configure_optimizers (Lightning raises)
        why = (f"while {trainer.state_stage}() sets up (setup, configure_model, configure_optimizers, ...), where "
               "nothing records metrics yet; log it from on_train_start or a *_step method instead")
    else:
        why = "outside fit/validate/test (nothing records metrics then)"
    warnings.warn(f"self.log({name!r}, ...) was called {why}; the value is ignored.", stacklevel=4)
