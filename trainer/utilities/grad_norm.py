"""``grad_norm(module, norm_type)``: the gradient norm of each parameter and of them all, as Lightning's utility
returns it (for ``self.log_dict`` in ``on_before_optimizer_step``)."""
from __future__ import annotations

from typing import Union

import torch
from torch import Tensor, nn

from trainer.strategies.errors import ConfigurationError


def grad_norm(module: nn.Module, norm_type: Union[float, int, str], group_separator: str = "/") -> dict[str, Tensor]:
    """``{"grad_2.0_norm/<param>": ..., "grad_2.0_norm_total": ...}`` over the parameters that have a gradient."""
    norm_type = float(norm_type)
    if norm_type <= 0:
        raise ConfigurationError(f"grad_norm(norm_type={norm_type}) must be a positive number or 'inf'.")
    norms = {
        f"grad_{norm_type}_norm{group_separator}{name}": p.grad.data.norm(norm_type)
        for name, p in module.named_parameters()
        if p.grad is not None
    }
    if norms:
        norms[f"grad_{norm_type}_norm_total"] = torch.tensor(list(norms.values())).norm(norm_type)
    return norms
