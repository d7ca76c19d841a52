"""``LearningRateMonitor``: logs every optimizer's learning rate (per parameter group) as training goes."""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, Optional

from trainer.callbacks.callback import Callback
from trainer.strategies.errors import ConfigurationError


class LearningRateMonitor(Callback):
    """Log ``lr-<Optimizer>`` (``lr-<Optimizer>/pg<i>`` with several parameter groups, ``/<name>`` for a group
    with a ``"name"``; a scheduler dict's ``"name"`` replaces ``lr-<Optimizer>``) to the loggers.

    ``logging_interval="step"`` logs, at the Trainer's logging steps (``log_every_n_steps``), the rate that
    step used; ``"epoch"`` logs at each epoch start; ``None`` picks "step" when a scheduler steps per
    step, else "epoch". Optionally also momentum (or Adam's ``beta1``) and weight decay. Values also
    appear in ``trainer.callback_metrics``; as in Lightning, :attr:`lrs` keeps every logged rate per name and
    :attr:`last_momentum_values` / :attr:`last_weight_decay_values` the latest. It needs a logger.
    """

    def __init__(
        self,
        logging_interval: Optional[str] = None,
        log_momentum: bool = False,
        log_weight_decay: bool = False,
        log_key_prefix: Optional[str] = None,
    ) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ConfigurationError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}) must be None, 'step' or 'epoch'."
            )
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.log_key_prefix = log_key_prefix  # "optim/" logs "optim/lr-Adam"
        self._interval = logging_interval or "epoch"
        self._names: list[list[str]] = []
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, Optional[float]] = {}
        self.last_weight_decay_values: dict[str, Optional[float]] = {}

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if not trainer.loggers:
            raise ConfigurationError(
                "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger: it logs to the "
                "Trainer's loggers, and this Trainer has none (logger=False). Give it a logger (e.g. "
                "logger=CSVLogger('logs')), or drop the callback."
            )
        if self.log_momentum and any("momentum" not in o.defaults and "betas" not in o.defaults
                                     for o in trainer.optimizers):  # fmt: skip
            warnings.warn("You have set log_momentum=True, but some optimizers do not have momentum. This will log a "
                          "value 0 for the momentum.", RuntimeWarning, stacklevel=2)  # fmt: skip
        if self.logging_interval is None:
            step_scheduled = any(c.interval == "step" for c in trainer.lr_scheduler_configs)
            self._interval = "step" if step_scheduled else "epoch"
        self._names = self._prefixed(_group_names(trainer.optimizers, trainer.lr_scheduler_configs))
        flat = [name for names in self._names for name in names]
        self.lrs = {name: [] for name in flat}
        self.last_momentum_values = {f"{name}-momentum": None for name in flat}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in flat}

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if self._interval == "epoch":
            module.log_dict(self._record(self.current_values(trainer)), on_step=False, on_epoch=True)

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        # Read before the step, so the value logged for step N is the rate step N used.
        # Counted in batches that stepped, as the loggers' interval (several optimizers step once each per batch).
        stepped = trainer.fit_loop.progress.batches_that_stepped
        if self._interval == "step" and (stepped + 1) % trainer.log_every_n_steps == 0:
            module.log_dict(self._record(self.current_values(trainer)), on_step=True, on_epoch=False)

    def _prefixed(self, names: list[list[str]]) -> list[list[str]]:
        prefix = self.log_key_prefix or ""
        return [[prefix + name for name in group] for group in names]

    def _record(self, values: dict[str, float]) -> dict[str, float]:
        for name, value in values.items():
            if name in self.last_momentum_values:
                self.last_momentum_values[name] = value
            elif name in self.last_weight_decay_values:
                self.last_weight_decay_values[name] = value
            else:
                self.lrs.setdefault(name, []).append(value)
        return values

    def current_values(self, trainer: Any) -> dict[str, float]:
        """``{name: value}`` for every optimizer's parameter groups, as they are now."""
        if not self._names:
            self._names = self._prefixed(_group_names(trainer.optimizers, trainer.lr_scheduler_configs))
        values: dict[str, float] = {}
        for optimizer, names in zip(trainer.optimizers, self._names):
            for group, name in zip(optimizer.param_groups, names):
                values[name] = float(group["lr"])
                if self.log_momentum:
                    # As in Lightning, an optimizer without momentum or betas logs 0 (warned at the start).
                    momentum = group.get("momentum", group.get("betas", (0.0,))[0])
                    values[f"{name}-momentum"] = float(momentum)
                if self.log_weight_decay and "weight_decay" in group:
                    values[f"{name}-weight_decay"] = float(group["weight_decay"])
        return values


def _group_names(optimizers: list[Any], scheduler_configs: list[Any] = ()) -> list[list[str]]:
    """``lr-SGD``, ``lr-SGD-1`` for a second SGD (or the name of the optimizer's scheduler dict), with ``/pg<i>``
    suffixes when an optimizer has several groups (``/<name>`` for a group that has a ``"name"``, as Lightning)."""
    scheduler_names = {}
    for config in scheduler_configs:
        owner = getattr(config.scheduler, "optimizer", None)
        if config.name is not None and owner is not None:
            scheduler_names[id(owner)] = config.name
    seen: Counter[str] = Counter()
    names: list[list[str]] = []
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)  # a wrapper (e.g. ZeRO) exposes the torch optimizer
        base = scheduler_names.get(id(inner), scheduler_names.get(id(optimizer)))
        if base is None:
            kind = type(inner).__name__
            base = f"lr-{kind}" + (f"-{seen[kind]}" if seen[kind] else "")
            seen[kind] += 1
        groups = optimizer.param_groups
        group_names = [group.get("name", f"pg{i + 1}") for i, group in enumerate(groups)]
        duplicates = sorted({name for name in group_names if group_names.count(name) > 1})
        if duplicates:
            raise ConfigurationError(
                f"LearningRateMonitor: the parameter groups of {base!r} share the names {duplicates}, so their "
                "learning rates would be logged under one name (A single `Optimizer` cannot have multiple parameter "
                "groups with identical `name` values). Give each group its own 'name'."
            )
        if len(groups) == 1:
            names.append([f"{base}/{groups[0]['name']}" if "name" in groups[0] else base])
        else:
            names.append([f"{base}/{name}" for name in group_names])
    return names
