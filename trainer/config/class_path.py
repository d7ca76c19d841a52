"""What a ``class_path`` entry of a config file names (``trainer.callbacks.EarlyStopping``, ``my_pkg.MyModel``).

Config files written before the ``trainer.`` namespace name the framework's packages by their short names
(``callbacks.EarlyStopping``): where such a name does not import as written (an installed package has no
top-level ``callbacks``), it is read as ``trainer.callbacks.EarlyStopping``. A module of the user's own with that
name (a ``callbacks.py`` beside the script) is found first, as written."""
from __future__ import annotations

import importlib
from typing import Any

_OUR_SHORT_NAMES = ("callbacks", "loggers", "strategies")


def import_class_path(path: str) -> Any:
    """The object ``path`` (``package.module.Name``) names; raises ImportError/AttributeError/ValueError as
    ``importlib`` does when neither the name as written nor its ``trainer.`` form exists."""
    module_name, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        if module_name.partition(".")[0] not in _OUR_SHORT_NAMES:
            raise
    return getattr(importlib.import_module("trainer." + module_name), name)
