"""``FabricModule``: what ``fabric.setup`` returns when the strategy wraps the module (DDP): calls go through the
wrapper (so gradients synchronise), while attributes, methods and the state dict are the user's module's, as with
Lightning's ``_FabricModule``. Without it ``model.max_seq_length = 256`` on a DDP-wrapped model would land on the
wrapper, silently, and ``model.generate(...)`` would not be found."""
from __future__ import annotations

from typing import Any

from torch import nn


class FabricModule(nn.Module):
    """The strategy's wrapper for calls, the user's module for everything else (``.module`` is the user's)."""

    def __init__(self, forward_module: nn.Module, original_module: nn.Module) -> None:
        super().__init__()
        self._forward_module = forward_module  # registered: parameters(), train()/eval(), to() reach it
        object.__setattr__(self, "_original_module", original_module)  # not registered: no duplicate parameters
        object.__setattr__(self, "_fabric_module_ready", True)

    @property
    def module(self) -> nn.Module:
        """The user's module."""
        return self._original_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The strategy wrapper's forward (DDP's: gradient synchronisation is prepared here)."""
        return self._forward_module(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """The user's module's state dict (its own keys, no wrapper prefix)."""
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Load into the user's module."""
        return self._original_module.load_state_dict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._original_module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if not self.__dict__.get("_fabric_module_ready") or name == "training":
            super().__setattr__(name, value)
            if name != "training":
                return
        setattr(self._original_module, name, value)
