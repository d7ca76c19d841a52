"""``file.py:Name`` / ``package.module:Name``: a module class (with JSON keyword arguments) or a function returning
the module, loaded once and called once per rank role (each role shards its own copy)."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from torch import nn

from trainer.strategies.errors import ConfigurationError


def load_object(spec: str, kind: str) -> Any:
    """``path/to/module.py:NAME`` or ``package.module:NAME`` → an ``nn.Module`` class (``kind="class"``), a
    function (``kind="function"``), or either (``kind="module"``)."""
    target, _, name = spec.partition(":")
    if not name:
        raise ConfigurationError(f"'{spec}' must be 'path/to/file.py:Name' or 'package.module:Name'.")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ConfigurationError(f"'{target}' does not exist.")
        sys.path.insert(0, str(path.resolve().parent))
        spec_obj = importlib.util.spec_from_file_location(path.stem, path)
        loaded = importlib.util.module_from_spec(spec_obj)
        sys.modules[spec_obj.name] = loaded  # dataclasses and pickling look their module up there
        spec_obj.loader.exec_module(loaded)
    else:
        loaded = importlib.import_module(target)
    found: Any = getattr(loaded, name, None)
    if kind == "class" and not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise ConfigurationError(f"'{spec}': {name!r} is not an nn.Module class in {target}.")
    if kind == "module" and not (isinstance(found, type) and issubclass(found, nn.Module)
                                 or callable(found) and not isinstance(found, type)):  # fmt: skip
        raise ConfigurationError(f"'{spec}': {name!r} is not an nn.Module class in {target}, nor a function "
                                 "returning one.")  # fmt: skip
    if kind == "function" and not (callable(found) and not isinstance(found, type)):
        raise ConfigurationError(f"'{spec}': {name!r} is not a function in {target}.")
    return found


def module_factory(spec: str, init_args: Optional[str] = None) -> Callable[[], nn.Module]:
    """A function building the module ``spec`` names: a class called with ``init_args`` (a JSON object), or a
    function returning the module. A class whose required arguments are missing is an error that says how."""
    kwargs: Any = {}
    if init_args is not None:
        try:
            kwargs = json.loads(init_args)
        except ValueError as err:
            raise ConfigurationError(f"--init-args {init_args!r} is not JSON ({err}). Pass an object, e.g. "
                                     "--init-args '{\"n_layer\": 48, \"vocab_size\": 50304}'.") from None  # fmt: skip
        if not isinstance(kwargs, dict):
            raise ConfigurationError(f"--init-args {init_args!r} must be a JSON object of keyword arguments.")
    target = load_object(spec, "module")
    name = spec.partition(":")[2]
    try:
        inspect.signature(target).bind(**kwargs)
    except TypeError as err:
        missing = [p.name for p in inspect.signature(target).parameters.values()
                   if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                   and p.name not in kwargs]  # fmt: skip
        what = f"needs the argument(s) {', '.join(missing)}" if missing else f"cannot take these arguments ({err})"
        example = ", ".join(f'"{m}": ...' for m in missing) or '"name": value'
        raise ConfigurationError(
            f"'{spec}': {name} {what}. Pass them as --init-args '{{{example}}}' (JSON), or name a function that "
            f"builds the model instead, e.g. {spec.partition(':')[0]}:make_model with def make_model(): return "
            f"{name}(...)."
        ) from None
    except ValueError:  # no signature (a builtin): let the call say
        pass

    def build() -> nn.Module:
        module = target(**kwargs)
        if not isinstance(module, nn.Module):
            raise ConfigurationError(f"'{spec}' returned {type(module).__name__}, not an nn.Module.")
        return module

    return build
