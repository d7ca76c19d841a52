"""Parse what ``configure_optimizers`` returns, and step LR schedulers by interval and frequency."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from torch.optim import Optimizer

from trainer.strategies.errors import ConfigurationError

_SCHEDULER_KEYS = ("scheduler", "interval", "frequency", "monitor", "strict", "name")
_FORMS = (
    "configure_optimizers must return one of: an optimizer; a list of optimizers; "
    "([optimizers], [schedulers]); {'optimizer': opt, 'lr_scheduler': sched or {'scheduler': sched, "
    "'interval': 'epoch'|'step', 'frequency': 1, 'monitor': 'val_loss'}}; a list of such dicts; or None."
)


@dataclass
class SchedulerConfig:
    """One LR scheduler and when to step it."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: Optional[str] = None
    strict: bool = True
    name: Optional[str] = None
    reduce_on_plateau: bool = False
    #: ``module.lr_scheduler_step(scheduler, metric)`` where the module overrides it (e.g. timm schedulers).
    step_fn: Optional[Callable[[Any, Any], None]] = None


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, Optimizer) or (hasattr(obj, "step") and hasattr(obj, "param_groups"))


def _is_plateau(scheduler: Any) -> bool:
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    return isinstance(scheduler, ReduceLROnPlateau)


def _scheduler_config(item: Any, monitor: Optional[str] = None, automatic: bool = True) -> SchedulerConfig:
    if isinstance(item, dict):
        unknown = set(item) - set(_SCHEDULER_KEYS)
        if unknown:  # Lightning warns and ignores them (a typo'd key then does nothing: hence the warning)
            warnings.warn(
                f"configure_optimizers: Found unsupported keys in the lr scheduler dict: {{{', '.join(map(repr, sorted(unknown)))}}}; "
                f"they are ignored. Valid keys: {list(_SCHEDULER_KEYS)}; remove the others (a misspelt 'interval' or "
                "'frequency' has no effect).",
                RuntimeWarning,
                stacklevel=2,
            )
        if "scheduler" not in item:
            raise ConfigurationError('configure_optimizers: The lr scheduler dict must have the key "scheduler" with '
                                     "its item being an lr scheduler.")  # fmt: skip
        if not automatic and {"monitor", "strict"} & set(item):
            warnings.warn(
                f"configure_optimizers: The lr scheduler dict contains the key(s) {sorted({'monitor', 'strict'} & set(item))}, "
                "but the keys will be ignored in manual optimisation, where you call scheduler.step() yourself.",
                RuntimeWarning, stacklevel=3,
            )
        config = SchedulerConfig(**{"monitor": monitor, **{k: v for k, v in item.items() if k not in unknown}})
    else:
        config = SchedulerConfig(scheduler=item, monitor=monitor)
    scheduler = config.scheduler
    if not automatic:  # the user steps it: any scheduler (timm's, a ReduceLROnPlateau without a monitor)
        if not (hasattr(scheduler, "state_dict") and hasattr(scheduler, "load_state_dict")):
            raise ConfigurationError(
                f"configure_optimizers: the scheduler {type(scheduler).__name__} has no state_dict/load_state_dict, "
                "so checkpoints could not save it. Add both methods (as torch.optim.lr_scheduler classes have)."
            )
        config.reduce_on_plateau = _is_plateau(scheduler)
        return config
    if not hasattr(scheduler, "step") or not hasattr(scheduler, "optimizer"):
        raise ConfigurationError(
            f"configure_optimizers: The provided lr scheduler `{type(scheduler).__name__}` doesn't follow PyTorch's "
            "LRScheduler API: it needs .step() and .optimizer, like torch.optim.lr_scheduler classes (in manual "
            "optimisation, where you step it yourself, any scheduler with state_dict/load_state_dict is accepted)."
        )
    if config.interval not in ("epoch", "step"):
        raise ConfigurationError(
            f'configure_optimizers: The "interval" key in lr scheduler dict must be "step" or "epoch" but is '
            f'"{config.interval}".'
        )
    if isinstance(config.frequency, bool) or not isinstance(config.frequency, int) or config.frequency < 1:
        raise ConfigurationError(f"configure_optimizers: lr_scheduler frequency={config.frequency!r} must be an int >= 1.")
    if config.interval == "epoch" and type(scheduler).__name__ == "OneCycleLR":
        warnings.warn(
            "configure_optimizers: A `OneCycleLR` scheduler is using 'interval': 'epoch', so its cycle (total_steps) "
            "is spread over epochs. OneCycleLR is usually stepped per batch: Are you sure you didn't mean "
            "'interval': 'step'?",
            RuntimeWarning,
            stacklevel=2,
        )
    config.reduce_on_plateau = _is_plateau(scheduler)
    if config.reduce_on_plateau and not config.monitor:
        raise ConfigurationError(
            "`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is used: the metric it "
            "reduces on. Return {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}}."
        )
    return config


def _from_dict(item: dict, automatic: bool) -> tuple[Optimizer, list[SchedulerConfig]]:
    unknown = set(item) - {"optimizer", "lr_scheduler", "monitor"}
    if unknown:  # Lightning warns and ignores them, as for the scheduler dict
        warnings.warn(
            f"configure_optimizers: unsupported key(s) {sorted(unknown)} in the optimizer configuration are ignored. "
            "Valid keys: 'optimizer', 'lr_scheduler', 'monitor'.",
            RuntimeWarning,
            stacklevel=3,
        )
    if "optimizer" not in item or not _is_optimizer(item["optimizer"]):
        raise ConfigurationError("Unknown configuration for model optimizers: configure_optimizers returned a dict "
                                 f"without a usable 'optimizer'. {_FORMS}")  # fmt: skip
    schedulers = []
    if item.get("lr_scheduler") is not None:
        schedulers.append(_scheduler_config(item["lr_scheduler"], item.get("monitor"), automatic))
    return item["optimizer"], schedulers


def parse_optimizers(output: Any, automatic: bool = True) -> tuple[list[Optimizer], list[SchedulerConfig]]:
    """Normalise every accepted ``configure_optimizers`` form into (optimizers, scheduler configs). In manual
    optimisation (``automatic=False``) the user steps the schedulers, so any scheduler object is accepted. A
    scheduler attached to an optimizer that was not returned is refused (it would change a learning rate nobody
    uses)."""
    optimizers, schedulers = _parse(output, automatic)
    for config in schedulers:
        attached = getattr(config.scheduler, "optimizer", None)
        if attached is not None and _is_optimizer(attached) and not any(attached is o for o in optimizers):
            raise ConfigurationError(
                f"configure_optimizers: the scheduler {type(config.scheduler).__name__} is attached with an optimizer "
                "that wasn't returned. Build the scheduler on one of the optimizers you return, or return its "
                "optimizer too."
            )
    return optimizers, schedulers


def _parse(output: Any, automatic: bool) -> tuple[list[Optimizer], list[SchedulerConfig]]:
    if output is None:
        warnings.warn("configure_optimizers returned None: this fit will run with no optimizer.", stacklevel=2)
        return [], []
    if _is_optimizer(output):
        return [output], []
    if isinstance(output, dict):
        optimizer, schedulers = _from_dict(output, automatic)
        return [optimizer], schedulers
    if isinstance(output, (list, tuple)):
        items = list(output)
        if len(items) == 2 and isinstance(items[0], (list, tuple)):
            optimizers = list(items[0])
            scheduler_items = items[1] if isinstance(items[1], (list, tuple)) else [items[1]]
            if not optimizers or not all(_is_optimizer(o) for o in optimizers):
                raise ConfigurationError("Unknown configuration for model optimizers: the first list "
                                         f"configure_optimizers returned must hold optimizers. {_FORMS}")  # fmt: skip
            return optimizers, [_scheduler_config(s, None, automatic) for s in scheduler_items]
        if items and all(_is_optimizer(o) for o in items):
            return items, []
        if items and all(isinstance(o, dict) for o in items):
            optimizers, schedulers = [], []
            for item in items:
                optimizer, configs = _from_dict(item, automatic)
                optimizers.append(optimizer)
                schedulers.extend(configs)
            return optimizers, schedulers
    raise ConfigurationError(f"Unknown configuration for model optimizers: configure_optimizers returned "
                             f"{type(output).__name__} {output!r:.200}. {_FORMS}")  # fmt: skip


def step_schedulers(
    configs: list[SchedulerConfig], interval: str, counter: int, metrics: Callable[[], dict[str, Any]]
) -> None:
    """Step every scheduler of ``interval`` whose ``frequency`` divides ``counter`` (steps or epochs done)."""
    for config in configs:
        if config.interval != interval or counter % config.frequency:
            continue
        if config.reduce_on_plateau:
            available = metrics()
            value = available.get(config.monitor)
            if value is None:
                if config.strict:
                    raise ConfigurationError(
                        f"ReduceLROnPlateau conditioned on metric {config.monitor!r} which is not available. Available "
                        f"metrics are: {sorted(available)}. Log it with self.log({config.monitor!r}, ...) or set "
                        "'strict': False."
                    )
                warnings.warn(f"ReduceLROnPlateau conditioned on metric {config.monitor!r} which is not available but "
                              "strict is set to `False`: it was not logged yet. Skipping learning rate update.",
                              RuntimeWarning, stacklevel=2)  # fmt: skip
                continue
            if config.step_fn is not None:
                config.step_fn(config.scheduler, float(value))
            else:
                config.scheduler.step(float(value))
        elif config.step_fn is not None:
            config.step_fn(config.scheduler, None)
        else:
            config.scheduler.step()
