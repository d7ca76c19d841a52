"""A module and its weights from a checkpoint file: ``TrainModule.load_from_checkpoint`` (rebuilt from the saved
hyperparameters) and loading a state dict with the missing/unexpected keys named instead of a traceback."""
from __future__ import annotations

import inspect
import os
from typing import Any, Optional, TypeVar, Union

import torch

from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, safe_load
from trainer.strategies.errors import ConfigurationError

# The TrainModule subclass being loaded (not imported here: train_module imports this module for the classmethod).
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def check_state_dict(module: torch.nn.Module, state_dict: dict[str, Any], path: Any, strict: bool = True) -> None:
    """Load ``state_dict`` into ``module``; on a mismatch list the missing/unexpected keys, not a traceback."""
    expected = set(module.state_dict().keys())
    found = set(state_dict.keys())
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"Checkpoint '{path}' does not match {type(module).__name__}: "
            f"missing keys {_short(missing)}, unexpected keys {_short(unexpected)}. Is it from a different model? "
            "Pass strict=False to load the matching part."
        )
    try:
        module.load_state_dict(state_dict, strict=strict)
    except RuntimeError as err:
        raise CheckpointError(f"Checkpoint '{path}' does not fit {type(module).__name__}: {err}") from None


def _short(keys: list[str], limit: int = 10) -> str:
    if not keys:
        return "[]"
    shown = ", ".join(keys[:limit])
    return f"[{shown}{', ... (%d more)' % (len(keys) - limit) if len(keys) > limit else ''}]"


def load_module_from_checkpoint(
    cls: type[ModuleT], path: Union[str, os.PathLike], map_location: Any, strict: bool, overrides: dict[str, Any]
) -> ModuleT:
    """Rebuild ``cls`` from the checkpoint's ``hyper_parameters`` (``overrides`` win) and load its weights."""
    checkpoint = safe_load(path, map_location=map_location or "cpu")
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"'{path}' is not a trainer checkpoint (no 'state_dict' entry).")
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    accepted = _init_argument_names(cls)
    if accepted is not None:  # e.g. a base class's save_hyperparameters() recorded arguments this class does not take
        hparams = {name: value for name, value in hparams.items() if name in accepted}
    hparams.update(overrides)
    try:
        module = cls(**hparams)
    except TypeError as err:
        raise ConfigurationError(
            f"{cls.__name__}.load_from_checkpoint: could not rebuild the module from the saved hyperparameters "
            f"{sorted(hparams)}: {err}. Pass missing arguments as overrides: "
            f"{cls.__name__}.load_from_checkpoint(path, name=value)."
        ) from None
    check_state_dict(module, checkpoint["state_dict"], path, strict)
    module.on_load_checkpoint(checkpoint)
    return module


def _init_argument_names(cls: type) -> Optional[set[str]]:
    """The keyword arguments ``cls(...)`` takes, or None when its ``__init__`` takes ``**kwargs``."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
