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
    decorated_inits,
    decorated_parameters,
    resolved_arguments,
)


def launch_aliases(**aliases: tuple[Any, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark arguments that set another one, as ``name=(target, *unset_values)`` (``mixed_precision=("precision",
    None)``): put beneath :func:`with_launch_defaults`. The alias counts as the script's setting of its target only
    when passed with a value not in ``unset_values``, so a script's default (``mixed_precision=None``,
    ``cpu=False``) leaves the launcher's setting in place, as Accelerate's config file does."""

    def mark(init: Callable[..., None]) -> Callable[..., None]:
        init._launch_aliases = dict(aliases)  # type: ignore[attr-defined]
        return init

    return mark


def with_launch_defaults(init: Callable[..., None]) -> Callable[..., None]:
    """Decorate ``Trainer.__init__`` (or ``Engine.__init__``): in a launched process the launcher's settings fill
    every argument the script did not pass; an argument the script passes wins, with a warning when the launcher
    said otherwise. Settings the decorated class does not take (an Engine has no ``max_epochs``) are left out."""
    signature = inspect.signature(init)
    accepted = set(signature.parameters)
    owner = init.__qualname__.partition(".")[0]
    open_keywords = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    decorated_parameters[owner] = tuple(name for name in signature.parameters if name != "self")
    decorated_inits[owner] = init
    aliases: dict[str, tuple[Any, ...]] = getattr(init, "_launch_aliases", {})

    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        if not open_keywords and not accepted.issuperset(kwargs):
            _unknown_argument(type(self).__name__, kwargs, decorated_parameters[owner])
        prefix = f"PL_{type(self).__name__.upper()}_"
        if any(key.startswith(prefix) for key in os.environ):
            explicit = signature.bind_partial(self, *args, **kwargs).arguments
            kwargs.update(env_defaults(prefix, [name for name in accepted if name not in explicit]))
        # The arguments the caller passed (defaults aside), for checks where passing a default value explicitly
        # differs from leaving it out (barebones=True with enable_checkpointing=True).
        self._passed_arguments = frozenset(signature.bind_partial(self, *args, **kwargs).arguments) - {"self"}
        if (ENV_CONFIG in os.environ or ENV_ARGS in os.environ) and not arguments_resolved():
            from trainer.config.yaml_config import instantiate, trainer_settings

            explicit = signature.bind_partial(self, *args, **kwargs).arguments
            # An alias the script set (not to its default) is the script's setting of its target.
            set_by_alias = {target for alias, (target, *unset) in aliases.items()
                            if alias in explicit and not any(explicit[alias] is u or explicit[alias] == u for u in unset)}
            for key, value in trainer_settings(os.environ.get(ENV_CONFIG)).items():
                if key not in accepted:
                    continue
                if key in set_by_alias and key not in explicit:
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


def env_defaults(prefix: str, names: list[str]) -> dict[str, Any]:
    """Lightning's ``PL_TRAINER_<ARGUMENT>`` variables (``PL_TRAINER_MAX_STEPS=7``): the value of each argument in
    ``names`` (those the script did not pass) that has a non-empty variable, read as a Python literal where it is one
    (``7``, ``False``, ``[0, 1]``) and as the string otherwise."""
    import ast

    found: dict[str, Any] = {}
    for name in names:
        raw = os.environ.get(prefix + name.upper())
        if raw:
            try:
                found[name] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                found[name] = raw
    return found


def _unknown_argument(owner: str, kwargs: dict[str, Any], valid: tuple[str, ...]) -> None:
    """``Trainer(max_epoch=3)``: a TypeError naming the closest valid argument, as the experiment file's check does."""
    from trainer.config.value_types import did_you_mean
    from trainer.strategies.errors import ConfigurationError

    key = next(k for k in kwargs if k not in valid)
    raise ConfigurationError(
        f"{owner}() got an unexpected keyword argument '{key}'.{did_you_mean(key, valid)} "
        f"help({owner}) lists the arguments."
    )
