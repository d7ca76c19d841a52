"""Which positional arguments a module's ``*_step`` method takes, read once per fit/stage (never per step).

As in Lightning, ``training_step(self, batch)`` is called without ``batch_idx``, and ``validation_step``/
``test_step``/``predict_step`` get ``dataloader_idx`` only when there are several dataloaders and the method
takes a third argument. A method takes ``batch_idx`` when it has a parameter of that name, ``*args``, or at
least two positional parameters (whatever their names).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from trainer.strategies.errors import StepSignatureError

#: More positional arguments than any step is ever given.
_UNBOUNDED = 99


def positional_capacity(method: Callable[..., Any]) -> int:
    """How many positional arguments the bound ``method`` accepts (``_UNBOUNDED`` with ``*args``)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: assume it takes what it is given
        return _UNBOUNDED
    count = 0
    for parameter in parameters:
        if parameter.kind is parameter.VAR_POSITIONAL:
            return _UNBOUNDED
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


def takes_batch_idx(method: Callable[..., Any]) -> bool:
    """True when ``method(batch, batch_idx)`` is the call to make; False for ``method(batch)``."""
    try:
        if "batch_idx" in inspect.signature(method).parameters:
            return True
    except (TypeError, ValueError):
        return True
    return positional_capacity(method) >= 2


def step_arity(method: Callable[..., Any], several_dataloaders: bool) -> int:
    """How many of ``(batch, batch_idx, dataloader_idx)`` an evaluation/predict step is given: 1, 2 or 3. A step
    that requires ``dataloader_idx`` with a single dataloader is refused (Lightning's words)."""
    if not several_dataloaders:
        _check_no_required_dataloader_idx(method)
    if not takes_batch_idx(method):
        return 1
    return 3 if several_dataloaders and positional_capacity(method) >= 3 else 2


def takes_dataloader_iter(method: Callable[..., Any]) -> bool:
    """True for Lightning's iterator-style step, ``*_step(self, dataloader_iter)``: it takes the batches itself
    with ``next(dataloader_iter)`` (see :class:`trainer.data.combined_loader.DataLoaderIter`)."""
    try:
        return "dataloader_iter" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _check_no_required_dataloader_idx(method: Callable[..., Any]) -> None:
    try:
        parameter = inspect.signature(method).parameters.get("dataloader_idx")
    except (TypeError, ValueError):
        return
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        owner = type(getattr(method, "__self__", None)).__name__
        stage = method.__name__.removesuffix("_step").replace("validation", "val")
        raise StepSignatureError(
            f"You provided only a single `{stage}_dataloader`, but have included `dataloader_idx` in "
            f"`{owner}.{method.__name__}()`. Either remove the argument or give it a default value i.e. "
            "`dataloader_idx=0`."
        )
