"""The precision plugin interface and full float32 (``Precision``, "32-true"); what the plugins share.

A plugin is owned by the Strategy; the Trainer never branches on precision. Each plugin answers:
module conversion, input conversion, a forward context, output conversion (for code that runs after the
forward, outside that context), backward (loss scaling), unscaling, the optimizer step and
``state_dict``/``load_state_dict`` for checkpoints.

Order inside one optimizer step (fixed for every plugin)::

    backward(scaled loss)            # once per micro-batch; gradients accumulate, still scaled
    ...                              # more micro-batches of the accumulation window
    unscale_gradients(optimizer)     # exactly once per optimizer step (no-op without a scaler)
    before_step()                    # on_before_optimizer_step hooks see true gradients, then clipping
    step                             # GradScaler.step: skipped when any gradient is inf/nan
    update                           # GradScaler.update: scale shrinks after a skip, grows after a streak

| spelling(s)                    | plugin                              |
|--------------------------------|-------------------------------------|
| "32-true", "32", 32            | ``Precision`` (float32)             |
| "64-true", "64", 64            | ``DoublePrecision``                 |
| "16-mixed", "16", 16           | ``MixedPrecision`` float16 + scaler |
| "bf16-mixed", "bf16"           | ``MixedPrecision`` bfloat16         |
| "16-true", "bf16-true"         | ``HalfPrecision``                   |

One file per plugin: ``double.py``, ``half.py``, ``mixed.py``; :func:`trainer.strategies.precision.precision_plugin`
turns a spelling into one.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError

_NULL_CONTEXT = contextlib.nullcontext()


def _apply_to_floating(data: Any, dtype: torch.dtype, only: Optional[torch.dtype] = None) -> Any:
    """Cast every floating-point tensor in a (nested) batch to ``dtype`` (with ``only``: just the tensors of that
    dtype); leave the rest alone."""
    if isinstance(data, Tensor):
        return data.to(dtype) if data.is_floating_point() and (only is None or data.dtype == only) else data
    if isinstance(data, dict):
        return type(data)((k, _apply_to_floating(v, dtype, only)) for k, v in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(_apply_to_floating(v, dtype, only) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_apply_to_floating(v, dtype, only) for v in data)
    return data


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class Precision:
    """Full float32 precision ("32-true"): the base plugin; every method is the plain PyTorch call."""

    name: str = "32-true"
    #: True when ``convert_input`` changes batches (lets the strategy skip the call otherwise).
    converts_input: bool = False
    #: Set per class from what it overrides: True where this class's ``forward_context``, ``backward`` or
    #: ``unscale_gradients`` is the base one, so the per-step path calls torch directly instead of a no-op layer.
    plain_forward: bool = True
    plain_backward: bool = True
    plain_unscale: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.plain_forward = cls.forward_context is Precision.forward_context
        cls.plain_backward = cls.backward is Precision.backward
        cls.plain_unscale = cls.unscale_gradients is Precision.unscale_gradients

    def setup(self, device: torch.device) -> None:
        """Bind to the device the strategy runs on; raise if that device cannot do this precision."""
        self.device_type = device.type

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Convert the module's parameters/buffers (in place where possible) and return it."""
        return module

    def convert_input(self, data: Any) -> Any:
        """Convert a batch's floating tensors to this precision's compute dtype."""
        return data

    def forward_context(self) -> ContextManager:
        """Context that wraps every ``*_step`` call (autocast for mixed precision)."""
        return _NULL_CONTEXT

    def init_context(self) -> ContextManager:
        """Context in which modules are built (``Trainer.init_module``, ``configure_model``): new floating tensors
        get the dtype the weights will have ("-true" precisions), so no float32 copy is made first."""
        return _NULL_CONTEXT

    def convert_output(self, data: Any) -> Any:
        """Convert what a module's forward returned, when the caller computes on it outside
        :meth:`forward_context` (a hand-written loop's loss). Identity here."""
        return data

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Run backward on ``loss`` (scaled where the plugin scales); extra arguments go to ``Tensor.backward``."""
        loss.backward(*args, **kwargs)

    def scale_loss(self, loss: Tensor) -> Tensor:
        """The loss as :meth:`backward` propagates it (scaled where the plugin scales, e.g. 16-mixed's gradient
        scaler): what a module's own ``backward(loss)`` receives. Identity here."""
        return loss

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Make the gradients of ``optimizer``'s parameters true gradients. Idempotent within a step."""

    def optimizer_step(
        self, optimizer: Optimizer, before_step: Callable[[], None], closure: Optional[Callable[[], Any]] = None,
        **kwargs: Any,
    ) -> bool:
        """Run the fixed step order (see module docstring). Returns False when the step was skipped. ``kwargs``
        go to ``optimizer.step``."""
        if closure is None:
            if not self.plain_unscale:
                self.unscale_gradients(optimizer)
            before_step()
            optimizer.step(**kwargs)
            return True

        def wrapped_closure() -> Any:
            result = closure()
            self.unscale_gradients(optimizer)
            before_step()
            return result

        optimizer.step(closure=wrapped_closure, **kwargs)
        return True

    def state_dict(self) -> dict[str, Any]:
        """State to store in checkpoints (the gradient scaler's, where there is one)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _check_dtype_supported(name: str, dtype: torch.dtype, device: torch.device) -> None:
    """Raise before training when ``device`` cannot compute in ``dtype`` natively."""
    if dtype is not torch.bfloat16:
        return
    if device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device) < (8, 0):
        # torch.cuda.is_bf16_supported() also says yes for slow emulation on older GPUs, hence the capability.
        raise ConfigurationError(
            f"precision={name!r} needs bfloat16, which {torch.cuda.get_device_name(device)} does not support "
            "natively (bfloat16 needs compute capability 8.0, e.g. A100/H100). Use precision='16-mixed'."
        )
    if device.type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise ConfigurationError(f"precision={name!r} needs bfloat16, which MPS supports from macOS 14. Use '16-mixed'.")


_ALIASES: dict[Any, str] = {
    "32-true": "32-true", "32": "32-true", 32: "32-true",
    "64-true": "64-true", "64": "64-true", 64: "64-true",
    "16-mixed": "16-mixed", "16": "16-mixed", 16: "16-mixed",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "16-true": "16-true", "bf16-true": "bf16-true",
}  # fmt: skip

VALID_PRECISIONS: tuple[Any, ...] = tuple(_ALIASES)


def canonical_precision(value: Any) -> str:
    """Map any accepted spelling (``16``, ``"bf16"``, ...) to its canonical name, or raise listing them all."""
    if isinstance(value, Precision):
        return value.name
    # str/int only: 16.0 hashes like 16 and would otherwise pass as a spelling nobody documented.
    if isinstance(value, (str, int)) and not isinstance(value, bool) and value in _ALIASES:
        return _ALIASES[value]
    spellings = ", ".join(repr(k) for k in _ALIASES)
    raise ConfigurationError(f"precision={value!r} is not supported. Precision {value!r} is invalid. Allowed "
                             f"precision values: {spellings}.")  # fmt: skip
