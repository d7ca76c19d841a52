""""16-mixed"/"bf16-mixed": float32 master weights, autocast, and the gradient scaler for float16."""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Optional

import torch
from torch import Tensor
from torch.amp.grad_scaler import OptState
from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision.base import Precision, _apply_to_floating, _check_dtype_supported

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

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss if self.scaler is None else self.scaler.scale(loss)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        scaler = self.scaler
        # The scaler's own per-optimizer stage is the one record of "already unscaled in this step".
        if scaler is not None and scaler.is_enabled() and _stage(scaler, optimizer) is OptState.READY:
            scaler.unscale_(optimizer)

    def optimizer_step(
        self, optimizer: Optimizer, before_step: Callable[[], None], closure: Optional[Callable[[], Any]] = None,
        **kwargs: Any,
    ) -> bool:
        scaler = self.scaler
        if scaler is None:
            return super().optimizer_step(optimizer, before_step, closure, **kwargs)
        if closure is not None:
            raise ConfigurationError(
                "optimizer.step(closure) is not supported with precision='16-mixed': the gradient scaler must see "
                "the gradients before the step. Call the closure yourself, then optimizer.step() without it."
            )
        self.unscale_gradients(optimizer)
        before_step()
        skipped = _found_inf(scaler, optimizer)
        scaler.step(optimizer, **kwargs)
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
