"""Trainer defaults from the launcher: a process started by ``trainer run``/``trainer slurm`` finds the
experiment file in ``TRAINER_CONFIG`` and the launcher's flags (JSON) in ``TRAINER_ARGS``.

Kept apart from :mod:`trainer.config.yaml_config` so that a plain ``import trainer`` pays one decorator and,
per Trainer, one environment look-up; the YAML machinery is imported only inside a launched process.
"""
from __future__ import annotations

import functools
import inspect
import os
import warnings
from typing import Any, Callable

from trainer.config.launch_env import (  # noqa: F401  (ENV_*, resolved_arguments: importable here as before)
    ENV_ARGS,
    ENV_CONFIG,
    arguments_resolved,
    decorated_parameters,
    resolved_arguments,
)


def with_launch_defaults(init: Callable[..., None]) -> Callable[..., None]:
    """Decorate ``Trainer.__init__`` (or ``Engine.__init__``): in a launched process the launcher's settings fill
    every argument the script did not pass; an argument the script passes wins, with a warning when the launcher
    said otherwise. Settings the decorated class does not take (an Engine has no ``max_epochs``) are left out."""
    signature = inspect.signature(init)
    accepted = set(signature.parameters)
    decorated_parameters[init.__qualname__.partition(".")[0]] = tuple(name for name in signature.parameters if name != "self")

    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        if (ENV_CONFIG in os.environ or ENV_ARGS in os.environ) and not arguments_resolved():
            from trainer.config.yaml_config import instantiate, trainer_settings

            explicit = signature.bind_partial(self, *args, **kwargs).arguments
            for key, value in trainer_settings(os.environ.get(ENV_CONFIG)).items():
                if key not in accepted:
                    continue
                if key not in explicit:
                    kwargs[key] = instantiate(value)
                elif explicit[key] != value and not isinstance(value, (dict, list)):
                    warnings.warn(
                        f"The launcher set {type(self).__name__} {key}={value!r} (config file or --trainer.{key}), "
                        f"but the script passes {key}={explicit[key]!r}; the script's value is used. Leave it out of "
                        "the script to set it from the config file or command line.",
                        stacklevel=2,
                    )
        init(self, *args, **kwargs)

    return wrapped
