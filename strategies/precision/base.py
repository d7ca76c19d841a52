"""Precision plugins: how a module's numbers are stored, computed and stepped.

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
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import Tensor, nn
from torch.amp.grad_scaler import OptState
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

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Make the gradients of ``optimizer``'s parameters true gradients. Idempotent within a step."""

    def optimizer_step(
        self, optimizer: Optimizer, before_step: Callable[[], None], closure: Optional[Callable[[], Any]] = None
    ) -> bool:
        """Run the fixed step order (see module docstring). Returns False when the step was skipped."""
        if closure is None:
            if not self.plain_unscale:
                self.unscale_gradients(optimizer)
            before_step()
            optimizer.step()
            return True

        def wrapped_closure() -> Any:
            result = closure()
            self.unscale_gradients(optimizer)
            before_step()
            return result

        optimizer.step(wrapped_closure)
        return True

    def state_dict(self) -> dict[str, Any]:
        """State to store in checkpoints (the gradient scaler's, where there is one)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class DoublePrecision(Precision):
    """"64-true": parameters, buffers and floating inputs in float64; new tensors default to float64."""

    name = "64-true"
    converts_input = True

    def setup(self, device: torch.device) -> None:
        if device.type == "mps":
            raise ConfigurationError(
                "precision='64-true' is not supported on MPS (Apple GPUs have no float64). "
                "Use precision='32-true' or accelerator='cpu'."
            )
        super().setup(device)

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.double()

    def convert_input(self, data: Any) -> Any:
        return _apply_to_floating(data, torch.float64)

    def forward_context(self) -> ContextManager:
        return _default_dtype(torch.float64)

    def init_context(self) -> ContextManager:
        return _default_dtype(torch.float64)


class HalfPrecision(Precision):
    """"16-true"/"bf16-true": weights, inputs and optimizer state all in float16/bfloat16 (no master copy).

    Halves memory against mixed precision but updates lose precision; the optimizer state is half too
    (a one-time warning says so).
    """

    converts_input = True

    def __init__(self, precision: str = "bf16-true") -> None:
        if precision not in ("16-true", "bf16-true"):
            raise ConfigurationError(f"HalfPrecision takes '16-true' or 'bf16-true', got {precision!r}.")
        self.name = precision
        self.dtype = torch.float16 if precision == "16-true" else torch.bfloat16
        self._warned = False

    def setup(self, device: torch.device) -> None:
        _check_dtype_supported(self.name, self.dtype, device)
        super().setup(device)

    def convert_module(self, module: nn.Module) -> nn.Module:
        if not self._warned:
            warnings.warn(
                f"precision={self.name!r} keeps the weights in {self.dtype} with no float32 master copy, so the "
                f"optimizer state (e.g. Adam moments) is {self.dtype} too. Use "
                f"'{self.name.replace('-true', '-mixed')}' if updates stall or diverge.",
                stacklevel=2,
            )
            self._warned = True
        return module.to(self.dtype)

    def convert_input(self, data: Any) -> Any:
        return _apply_to_floating(data, self.dtype)

    def forward_context(self) -> ContextManager:
        return _default_dtype(self.dtype)

    def init_context(self) -> ContextManager:
        return _default_dtype(self.dtype)


class MixedPrecision(Precision):
    """"16-mixed"/"bf16-mixed": float32 master weights, ops autocast to float16/bfloat16.

    "16-mixed" uses a ``torch.amp.GradScaler`` on the strategy's device type (CPU included): the loss is
    multiplied by the scale before backward, gradients are unscaled once per optimizer step, steps with
    inf/nan gradients are skipped and the scale adapts. "bf16-mixed" has float32's range and needs no scaler.
    Pass ``scaler=torch.amp.GradScaler(device_type, init_scale=..., growth_interval=...)`` to tune it.

    The scale is updated after every optimizer step (as Lightning does). With several optimizers in manual
    optimisation, run one optimizer's backward and step before the next optimizer's backward, so each
    gradient is unscaled with the scale it was scaled with.
    """

    def __init__(self, precision: str = "16-mixed", scaler: Optional[torch.amp.GradScaler] = None) -> None:
        if precision not in ("16-mixed", "bf16-mixed"):
            raise ConfigurationError(f"MixedPrecision takes '16-mixed' or 'bf16-mixed', got {precision!r}.")
        if precision == "bf16-mixed" and scaler is not None:
            raise ConfigurationError(
                "A GradScaler was passed with precision='bf16-mixed'. bfloat16 has float32's exponent range and "
                "needs no loss scaling: drop the scaler, or use precision='16-mixed'."
            )
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise ConfigurationError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}.")
        self.name = precision
        self.dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
        self.scaler = scaler
        self.device_type = "cpu"

    def setup(self, device: torch.device) -> None:
        device_type = device.type
        if not torch.amp.autocast_mode.is_autocast_available(device_type):
            raise ConfigurationError(
                f"precision={self.name!r} needs autocast on '{device_type}', which this PyTorch build does not "
                "offer. Use precision='32-true'."
            )
        _check_dtype_supported(self.name, self.dtype, device)
        self.device_type = device_type
        if self.dtype is not torch.float16:
            return
        if self.scaler is None:
            self.scaler = torch.amp.GradScaler(device_type)
        elif getattr(self.scaler, "_device", device_type) != device_type:
            # A GradScaler("cuda") built on a machine without CUDA has silently disabled itself.
            raise ConfigurationError(
                f"The GradScaler passed to MixedPrecision was built for '{self.scaler._device}', but training runs "
                f"on '{device_type}'. Build it with torch.amp.GradScaler({device_type!r}, ...)."
            )

    def forward_context(self) -> ContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype)

    def convert_output(self, data: Any) -> Any:
        """Floating outputs in the autocast dtype become float32, as they would be for an op autocast runs in
        float32 (a loss): a loss computed after the forward, outside autocast, is then the same."""
        return _apply_to_floating(data, torch.float32, only=self.dtype)

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        if self.scaler is None:
            loss.backward(*args, **kwargs)
        else:
            self.scaler.scale(loss).backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        scaler = self.scaler
        # The scaler's own per-optimizer stage is the one record of "already unscaled in this step".
        if scaler is not None and scaler.is_enabled() and _stage(scaler, optimizer) is OptState.READY:
            scaler.unscale_(optimizer)

    def optimizer_step(
        self, optimizer: Optimizer, before_step: Callable[[], None], closure: Optional[Callable[[], Any]] = None
    ) -> bool:
        scaler = self.scaler
        if scaler is None:
            return super().optimizer_step(optimizer, before_step, closure)
        if closure is not None:
            raise ConfigurationError(
                "optimizer.step(closure) is not supported with precision='16-mixed': the gradient scaler must see "
                "the gradients before the step. Call the closure yourself, then optimizer.step() without it."
            )
        self.unscale_gradients(optimizer)
        before_step()
        skipped = _found_inf(scaler, optimizer)
        scaler.step(optimizer)
        scaler.update()
        return not skipped

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def _stage(scaler: torch.amp.GradScaler, optimizer: Optimizer) -> OptState:
    return scaler._per_optimizer_states[id(optimizer)]["stage"]


def _found_inf(scaler: torch.amp.GradScaler, optimizer: Optimizer) -> bool:
    """Whether the unscaled gradients held inf/nan, i.e. whether ``scaler.step`` will skip this step.

    Reads the flags ``unscale_`` left for ``GradScaler.step``, which reads them with ``.item()`` right after:
    on CUDA the host waits here for the same unscale kernels it would wait for there, so the only addition
    is a one-element copy. (A fused optimizer, which the scaler lets skip on the device, pays one sync.)
    """
    if not scaler.is_enabled():
        return False
    flags = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
    return bool(sum(v.item() for v in flags.values()))


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
    raise ConfigurationError(f"precision={value!r} is not supported. Valid values: {spellings}.")


def precision_plugin(value: Any) -> Precision:
    """Build the plugin for a precision spelling (a ``Precision`` instance is returned as is)."""
    if isinstance(value, Precision):
        return value
    name = canonical_precision(value)
    if name == "32-true":
        return Precision()
    if name == "64-true":
        return DoublePrecision()
    if name in ("16-mixed", "bf16-mixed"):
        return MixedPrecision(name)
    return HalfPrecision(name)
