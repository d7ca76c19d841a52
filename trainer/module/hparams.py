"""Hyperparameter capture for ``save_hyperparameters`` and checkpoint-safe values."""
from __future__ import annotations

import argparse
import inspect
import warnings
from types import FrameType
from typing import Any, Iterable, Mapping, Optional, Union

import torch


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``hparams.lr`` and ``hparams["lr"]``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"No hyperparameter named {key!r}; recorded: {sorted(self, key=str)}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def collect_init_args(frame: FrameType, cls: type) -> dict[str, Any]:
    """The arguments of the ``__init__`` that is running in ``frame`` (``*args``/``**kwargs`` flattened)."""
    code = frame.f_code
    local_vars = frame.f_locals
    info = inspect.getargvalues(frame)
    if code.co_name != "__init__":
        raise RuntimeError("save_hyperparameters() must be called from the module's __init__.")
    values: dict[str, Any] = {}
    for name in info.args:
        if name in ("self", "__class__"):
            continue
        values[name] = local_vars[name]
    if info.varargs and local_vars.get(info.varargs):
        values[info.varargs] = list(local_vars[info.varargs])
    if info.keywords:
        values.update(local_vars.get(info.keywords) or {})
    return values


_PLAIN = (bool, int, float, str, type(None), torch.Tensor, torch.dtype, torch.device)


def is_plain(value: Any) -> bool:
    """True for values ``torch.load(weights_only=True)`` can restore: primitives, tensors and containers of them."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple, set)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int, float, bool)) and is_plain(v) for k, v in value.items())
    return False


def plain_hparams(values: dict[str, Any], owner: str) -> dict[str, Any]:
    """Keep the values a safe checkpoint can hold; warn once about each one that is skipped."""
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if is_plain(value):
            kept[key] = dict(value) if isinstance(value, dict) else value
        else:
            warnings.warn(
                f"{owner}.save_hyperparameters: {key!r} is a {type(value).__name__}, which a safe checkpoint cannot "
                f"hold; it is not recorded. Pass it to load_from_checkpoint({key}=...) when reloading, or "
                f"add ignore=[{key!r}].",
                stacklevel=4,
            )
    return kept


def hyperparameters_of_call(owner: Any, frame: FrameType, args: tuple, ignore: Optional[Union[str, Iterable[str]]]) -> dict:
    """What ``owner.save_hyperparameters(*args, ignore=...)`` records: the ``__init__`` arguments running in
    ``frame`` (all, or those named in ``args``; or one mapping or ``argparse.Namespace`` given as ``args[0]``), minus
    ``ignore``, kept plain."""
    from trainer.strategies.errors import ConfigurationError

    if len(args) == 1 and isinstance(args[0], argparse.Namespace):  # argparse-era modules: hparams as a Namespace
        values = vars(args[0]).copy()
    elif len(args) == 1 and isinstance(args[0], Mapping):
        values = dict(args[0])
    else:
        init_args = collect_init_args(frame, type(owner))
        if args:
            missing = [a for a in args if a not in init_args]
            if missing:
                raise ConfigurationError(f"save_hyperparameters: {missing} are not arguments of __init__.")
            values = {a: init_args[a] for a in args}
        else:
            values = init_args
    ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
    return plain_hparams({k: v for k, v in values.items() if k not in ignored}, type(owner).__name__)
