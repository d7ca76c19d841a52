"""A module converted by one Trainer's precision (``"64-true"``: float64, ``"bf16-true"``...) is converted back
for a later stage whose precision keeps the module as built (``"32-true"``, the mixed precisions), instead of
failing in the first step with torch's dtype mismatch. Lightning leaves this to the user; a module the user
built in float64 is left alone, since only a conversion the Trainer made is undone."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from trainer.strategies.rank import rank_zero_info

_MARK = "_dtype_before_precision"  # in the module's __dict__: (dtype it was built in, precision that changed it)


def floating_dtype(module: nn.Module) -> Optional[torch.dtype]:
    """The dtype of the module's first floating-point parameter (``None`` without one)."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


def undo_earlier_conversion(module: nn.Module, precision: Any) -> Optional[torch.dtype]:
    """Before the strategy sets the module up: convert back what an earlier stage's precision converted, when this
    precision would not convert it. Returns the module's floating dtype now (for :func:`remember_conversion`)."""
    marked = module.__dict__.get(_MARK)
    current = floating_dtype(module)
    if marked is None or current is None:
        return current
    built, converted_by = marked
    if type(precision).convert_module is not _base_convert_module() or current == built:
        return current
    module.to(built)
    del module.__dict__[_MARK]
    rank_zero_info("The module was in %s from an earlier precision=%r stage; converted back to %s for precision=%r.",
                   current, converted_by, built, precision.name)  # fmt: skip
    return built


def remember_conversion(module: nn.Module, before: Optional[torch.dtype], precision: Any) -> None:
    """After the set-up: note the dtype the module had if this precision converted it."""
    after = floating_dtype(module)
    if before is not None and after is not None and after != before and _MARK not in module.__dict__:
        module.__dict__[_MARK] = (before, precision.name)


def _base_convert_module() -> Any:
    from trainer.strategies.precision.plugins import Precision

    return Precision.convert_module
