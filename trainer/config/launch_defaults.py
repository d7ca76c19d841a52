"""Trainer defaults from the launcher: a process started by ``trainer run``/``trainer slurm`` finds the
experiment file in ``TRAINER_CONFIG`` and the launcher's flags (JSON) in ``TRAINER_ARGS``.

Kept apart from :mod:`trainer.config.yaml_config` so that a plain ``import trainer`` pays one decorator and,
per Trainer, one environment look-up; the YAML machinery is imported only inside a launched process.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import warnings
from typing import Any, Callable, Iterator

ENV_CONFIG = "TRAINER_CONFIG"
ENV_ARGS = "TRAINER_ARGS"

_state = threading.local()
#: The arguments of each class whose ``__init__`` is decorated (``"Trainer"``, ``"Engine"``), recorded when the class
#: is defined: the experiment-file checks read the Trainer's names here instead of importing the Trainer.
decorated_parameters: dict[str, tuple[str, ...]] = {}


@contextlib.contextmanager
def resolved_arguments() -> Iterator[None]:
    """Inside: Trainer arguments are final (``from_config`` merged the launcher's); no defaults are applied."""
    previous = getattr(_state, "resolved", False)
    _state.resolved = True
    try:
        yield
    finally:
        _state.resolved = previous


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
    aliases: dict[str, tuple[Any, ...]] = getattr(init, "_launch_aliases", {})
    decorated_parameters[init.__qualname__.partition(".")[0]] = tuple(name for name in signature.parameters if name != "self")

    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        if (ENV_CONFIG in os.environ or ENV_ARGS in os.environ) and not getattr(_state, "resolved", False):
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
