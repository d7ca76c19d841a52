"""``toggle_optimizer``/``untoggle_optimizer``: while one optimizer's step is computed (a GAN's generator, then its
discriminator), the parameters only the *other* optimizers hold get ``requires_grad=False``, so the backward does
not compute (or accumulate) gradients for them. Untoggling puts every flag back as it was before the toggle,
including parameters the user had frozen on purpose.
"""
from __future__ import annotations

from typing import Any, Iterable

from torch import Tensor
from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError


def raw_optimizer(optimizer: Any) -> Optimizer:
    """The torch optimizer behind what ``self.optimizers()`` returned (or the optimizer itself)."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, Optimizer) else optimizer


def _parameters(optimizer: Optimizer) -> Iterable[Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]


def toggle(optimizer: Any, optimizers: list[Optimizer]) -> dict[Tensor, bool]:
    """Switch off gradients of every parameter of ``optimizers`` that ``optimizer`` does not hold.

    Returns the ``requires_grad`` flags as they were, for :func:`untoggle`.
    """
    chosen = raw_optimizer(optimizer)
    if not any(chosen is opt for opt in optimizers):
        raise ConfigurationError(
            "toggle_optimizer() got an optimizer that configure_optimizers did not return; pass one of "
            "self.optimizers()."
        )
    saved: dict[Tensor, bool] = {}
    for opt in optimizers:
        for param in _parameters(opt):
            if param not in saved:
                saved[param] = param.requires_grad
                param.requires_grad_(False)
    for param in _parameters(chosen):
        param.requires_grad_(saved[param])
    return saved


def untoggle(saved: dict[Tensor, bool]) -> None:
    """Restore the ``requires_grad`` flags :func:`toggle` recorded."""
    for param, requires_grad in saved.items():
        param.requires_grad_(requires_grad)
