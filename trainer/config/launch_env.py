"""What a launcher hands the Trainers it starts: the two environment variables, which classes take launcher
defaults (and their arguments), and the switch that says a Trainer's arguments are final.

Below both users: :mod:`trainer.config.launch_defaults` (the ``__init__`` decorator) and
:mod:`trainer.config.yaml_config` (the experiment file) read it, so neither imports the other at load time.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

ENV_CONFIG = "TRAINER_CONFIG"
ENV_ARGS = "TRAINER_ARGS"

_state = threading.local()
#: The arguments of each class whose ``__init__`` is decorated (``"Trainer"``, ``"Engine"``), recorded when the class
#: is defined: the experiment-file checks read the Trainer's names here instead of importing the Trainer.
decorated_parameters: dict[str, tuple[str, ...]] = {}
#: The decorated ``__init__`` of each class, for the type hints the experiment-file checks read.
decorated_inits: dict[str, Callable[..., None]] = {}


@contextlib.contextmanager
def resolved_arguments() -> Iterator[None]:
    """Inside: Trainer arguments are final (``from_config`` merged the launcher's); no defaults are applied."""
    previous = getattr(_state, "resolved", False)
    _state.resolved = True
    try:
        yield
    finally:
        _state.resolved = previous


def arguments_resolved() -> bool:
    """Whether this thread is inside :func:`resolved_arguments`."""
    return getattr(_state, "resolved", False)
