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
        self._named: list[tuple[Any, list[str]]] = []  # each optimizer with its groups' names
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
        self._named = self._name_groups(trainer)
        flat = [name for _, names in self._named for name in names]
        self.lrs = {name: [] for name in flat}
        self.last_momentum_values = {f"{name}-momentum": None for name in flat}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in flat}

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if self._interval == "epoch":
            module.log_dict(self.current_values(trainer), on_step=False, on_epoch=True)

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        # Read before the step, so the value logged for step N is the rate step N used.
        # Counted in batches that stepped, as the loggers' interval (several optimizers step once each per batch).
        stepped = trainer.fit_loop.progress.batches_that_stepped
        if self._interval == "step" and (stepped + 1) % trainer.log_every_n_steps == 0:
            module.log_dict(self.current_values(trainer), on_step=True, on_epoch=False)

    def _name_groups(self, trainer: Any) -> list[tuple[Any, list[str]]]:
        prefix = self.log_key_prefix or ""
        named = _named_groups(trainer.optimizers, trainer.lr_scheduler_configs)
        return [(optimizer, [prefix + name for name in names]) for optimizer, names in named]

    def _renamed_if_groups_changed(self, trainer: Any) -> None:
        """A callback (``BaseFinetuning``) may add parameter groups during the fit: name them as Lightning does, the
        history of ``lr-X`` carrying on under ``lr-X/pg1`` once ``X`` has a second group."""
        if self._named and all(len(optimizer.param_groups) == len(names) for optimizer, names in self._named):
            return
        self._named = self._name_groups(trainer)
        for _, names in self._named:
            for name in names:
                single = name.replace("/pg1", "")
                if "/pg1" in name and single in self.lrs:
                    self.lrs[name] = self.lrs.pop(single)
                elif name not in self.lrs:
                    self.lrs[name] = []

    def current_values(self, trainer: Any) -> dict[str, float]:
        """``{name: value}`` for every optimizer's parameter groups, as they are now (also kept in :attr:`lrs`,
        :attr:`last_momentum_values` and :attr:`last_weight_decay_values`)."""
        self._renamed_if_groups_changed(trainer)
        values: dict[str, float] = {}
        for optimizer, names in self._named:
            for group, name in zip(optimizer.param_groups, names):
                values[name] = float(group["lr"])
                self.lrs.setdefault(name, []).append(values[name])
                if self.log_momentum:
                    # As in Lightning, an optimizer without momentum or betas logs 0 (warned at the start).
                    momentum = group.get("momentum", group.get("betas", (0.0,))[0])
                    values[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = float(momentum)
                if self.log_weight_decay and "weight_decay" in group:
                    decay = float(group["weight_decay"])
                    values[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = decay
        return values


def _named_groups(optimizers: list[Any], scheduler_configs: list[Any] = ()) -> list[tuple[Any, list[str]]]:
    """Each optimizer with its groups' names, in Lightning's order: the optimizers of the schedulers first (in the
    schedulers' order, named by a scheduler dict's ``"name"``, else ``lr-<Optimizer>``), then the optimizers
    without one (``lr-<Optimizer>``); a second optimizer of a class already named gets ``-1`` (then ``-2``, ...);
    several groups get ``/pg<i>`` suffixes (``/<name>`` for a group that has a ``"name"``)."""
    seen_types: Counter[type] = Counter()
    named: list[tuple[Any, list[str]]] = []
    with_scheduler: list[Any] = []
    for config in scheduler_configs:
        optimizer = getattr(config.scheduler, "optimizer", None)
        if optimizer is None:  # a custom scheduler that does not expose its optimizer: named with the others
            continue
        with_scheduler.append(optimizer)
        if config.name is None:
            seen_types[type(optimizer)] += 1
        base = config.name or f"lr-{type(optimizer).__name__}"
        named.append((optimizer, _group_names(base, optimizer, seen_types)))
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)  # a wrapper (e.g. ZeRO) exposes the torch optimizer
        if any(inner is known or optimizer is known for known in with_scheduler):
            continue
        seen_types[type(inner)] += 1
        named.append((inner, _group_names(f"lr-{type(inner).__name__}", inner, seen_types)))
    return named


def _group_names(base: str, optimizer: Any, seen_types: Counter[type]) -> list[str]:
    """``base`` (``-<n>`` added for the n+1-th optimizer of its class) for each of ``optimizer``'s groups."""
    seen = seen_types[type(optimizer)]
    if seen > 1:
        base = f"{base}-{seen - 1}"
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
        return [f"{base}/{groups[0]['name']}" if "name" in groups[0] else base]
    return [f"{base}/{name}" for name in group_names]
