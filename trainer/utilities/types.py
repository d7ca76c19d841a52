"""``pytorch_lightning.utilities.types`` after the rename: the type aliases a ported module annotates with."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional, TypedDict, Union

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from trainer.loops.optimizers import SchedulerConfig

_NUMBER = Union[int, float]
#: What a ``*_step`` may return: a loss tensor, a dict with a ``"loss"`` entry, or ``None`` (skip the step).
STEP_OUTPUT = Optional[Union[Tensor, Mapping[str, Any]]]
#: ``*_dataloader()`` returns: a DataLoader, any iterable, or a list/dict of them.
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]
LRSchedulerPLType = Union[LRScheduler, ReduceLROnPlateau]


#: What ``trainer.lr_scheduler_configs`` holds: one scheduler and when to step it (``scheduler``, ``interval``,
#: ``frequency``, ``monitor``, ``strict``, ``name``, ``reduce_on_plateau``), as Lightning's dataclass of that name.
LRSchedulerConfig = SchedulerConfig


class LRSchedulerConfigType(TypedDict, total=False):
    """The scheduler dict of ``configure_optimizers``: ``{"scheduler": ..., "interval": "epoch", ...}``."""

    scheduler: Any
    name: Optional[str]
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: Optional[str]
    strict: bool


class OptimizerConfig(TypedDict):
    """``{"optimizer": ...}``."""

    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict):
    """``{"optimizer": ..., "lr_scheduler": ...}``."""

    optimizer: Optimizer
    lr_scheduler: Union[LRSchedulerTypeUnion, LRSchedulerConfigType]


#: Every form ``configure_optimizers`` may return.
OptimizerLRScheduler = Optional[
    Union[
        Optimizer,
        Sequence[Optimizer],
        tuple[Sequence[Optimizer], Sequence[Union[LRSchedulerTypeUnion, LRSchedulerConfigType]]],
        OptimizerConfig,
        OptimizerLRSchedulerConfig,
        Sequence[OptimizerConfig],
        Sequence[OptimizerLRSchedulerConfig],
    ]
]

__all__ = [
    "EVAL_DATALOADERS",
    "LRSchedulerConfigType",
    "LRSchedulerPLType",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "OptimizerConfig",
    "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
    "STEP_OUTPUT",
    "TRAIN_DATALOADERS",
]
