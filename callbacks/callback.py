"""The ``Callback`` base: hooks that mirror the TrainModule's, each receiving ``(trainer, pl_module, ...)``
(Lightning's parameter names, so a hook called with keywords works as on Lightning).

The Trainer looks up once which hooks a callback overrides and calls only those, so an unimplemented
hook costs nothing. Callbacks talk to the Trainer only through the members written down in
:class:`trainer.callbacks.host.CallbackHost`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor
    from torch.optim import Optimizer

#: Every hook a callback may implement, in the order a fit first reaches them.
CALLBACK_HOOKS = (
    "setup", "on_fit_start", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
    "on_train_epoch_start", "on_train_batch_start", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end", "on_train_epoch_end",
    "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start", "on_validation_batch_end",
    "on_validation_epoch_end", "on_validation_end", "on_train_end", "on_fit_end",
    "on_test_start", "on_test_epoch_start", "on_test_batch_start", "on_test_batch_end", "on_test_epoch_end",
    "on_test_end", "on_predict_start", "on_predict_epoch_start", "on_predict_batch_start",
    "on_predict_batch_end", "on_predict_epoch_end", "on_predict_end",
    "on_save_checkpoint", "on_load_checkpoint", "on_exception", "teardown",
)  # fmt: skip


class Callback:
    """Base class for callbacks. Override the hooks you need; the rest are never called."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith(("trainer.callbacks.", "callbacks.")):
            _resolve_init_annotations(cls)

    @property
    def state_key(self) -> str:
        """Key under which this callback's ``state_dict`` is stored in checkpoints (unique per instance kind)."""
        return type(self).__qualname__

    def _generate_state_key(self, **kwargs: Any) -> str:
        """A state key that tells apart two instances of one class configured differently, in Lightning's format
        (the arguments in the order given): ``EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}``."""
        return f"{type(self).__qualname__}{repr(kwargs)}"

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (plain values and tensors only)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Called when fit/validate/test/predict begins, after the strategy is ready."""

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Called when fit/validate/test/predict ends."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Called at the very beginning of fit."""

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Called at the very end of fit."""

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        """Called before the sanity validation batches."""

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        """Called after the sanity validation batches."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Called when the training loop begins."""

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Called when the training loop ends."""

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Called at the end of each training epoch (after its validation)."""

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Called before ``training_step``."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after the micro-batch (and the optimizer step, when the window completed)."""

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: "Tensor") -> None:
        """Called before ``backward`` with the (accumulation-scaled) loss."""

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """Called after ``backward``; gradients may still be scaled under 16-mixed."""

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: "Optimizer") -> None:
        """Called before the optimizer step with true (unscaled), not-yet-clipped gradients."""

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: "Optimizer") -> None:
        """Called after the optimizer step, before gradients are cleared."""

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Called when a validation run begins."""

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Called when a validation run ends; epoch metrics are final here."""

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Called at the start of a validation epoch."""

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Called at the end of a validation epoch."""

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before ``validation_step``."""

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after ``validation_step``."""

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        """Called when a test run begins."""

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        """Called when a test run ends."""

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Called at the start of the test epoch."""

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Called at the end of the test epoch."""

    def on_test_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before ``test_step``."""

    def on_test_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after ``test_step``."""

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        """Called when a predict run begins."""

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        """Called when a predict run ends."""

    def on_predict_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Called at the start of the predict epoch."""

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Called at the end of the predict epoch."""

    def on_predict_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before ``predict_step``."""

    def on_predict_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after ``predict_step``."""

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Called when a checkpoint dict is being built; may add entries to it."""

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Called when a checkpoint is restored."""

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Called when fit/validate/test/predict raises (including KeyboardInterrupt)."""


def _resolve_init_annotations(cls: type) -> None:
    """Our callback modules use ``from __future__ import annotations``, which leaves ``__init__``'s annotations as
    strings; tools that build parsers from ``inspect.signature(ModelCheckpoint)`` (argparse-based, jsonargparse)
    need the types, as Lightning's callbacks give them. Resolved once, when the class is made."""
    init = cls.__dict__.get("__init__")
    if init is None or not any(isinstance(a, str) for a in getattr(init, "__annotations__", {}).values()):
        return
    import typing

    try:
        init.__annotations__ = typing.get_type_hints(init)
    except (NameError, TypeError, AttributeError):  # a name only imported for type checkers: leave the strings
        pass
