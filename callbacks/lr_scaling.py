"""Changing learning rates of a running fit, and the batch-size scaling rule ``scale_lr=True`` applies.

**Linear scaling rule** (Goyal et al., 2017, "Accurate, Large Minibatch SGD"): when the batch size is
multiplied by ``k``, multiply the learning rate by ``k``; the expected update per sample stays the same.
It holds well for SGD with momentum up to a few thousand samples per batch, usually with a warm-up for
large ``k``. For Adam-type optimizers the **square-root rule** (multiply by ``sqrt(k)``) is often the
better start. Either is a starting point to check with :class:`~callbacks.LearningRateFinder`, not a law.
"""
from __future__ import annotations

import math
from typing import Any, Union

from trainer.strategies.errors import ConfigurationError


def batch_scaling_factor(old_batch_size: int, new_batch_size: int, rule: Union[bool, str]) -> float:
    """The learning-rate factor for a batch-size change: ``"linear"`` (or ``True``) ``new/old``, ``"sqrt"``
    its square root, ``False`` 1."""
    if rule is False or rule is None:
        return 1.0
    ratio = new_batch_size / old_batch_size
    if rule is True or rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    raise ConfigurationError(f"scale_lr={rule!r} must be False, True/'linear' or 'sqrt'.")


def scale_learning_rates(trainer: Any, factor: float) -> None:
    """Multiply every optimizer parameter group's learning rate by ``factor``, and the base rates the
    schedulers compute from (``initial_lr``, ``base_lrs``), so a schedule keeps its shape at the new scale."""
    for optimizer in trainer.optimizers:
        for group in optimizer.param_groups:
            group["lr"] *= factor
            if "initial_lr" in group:
                group["initial_lr"] *= factor
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]


def record_hparam(module: Any, names: tuple[str, ...], value: Any) -> None:
    """Set ``value`` on each of ``names`` that the module has as an attribute or hyperparameter, so the
    module and its checkpoints record what a finder chose."""
    for name in names:
        if name in module.hparams:
            module.hparams[name] = value
        if hasattr(module, name) and not callable(getattr(module, name)):
            setattr(module, name, value)
