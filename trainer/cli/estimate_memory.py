"""``trainer estimate-memory``: per-device memory of a module under each strategy, and a recommendation.

    trainer estimate-memory model.py:GPT --world-size 8 --precision bf16-mixed --device-memory 80GB --wrap Block

The class is built with no arguments on the ``meta`` device (no memory, no weights), so a model far larger
than this machine is planned in seconds; its ``example_input_array``, if set, gives the activations. The
figures come from :mod:`trainer.memory`; ``model_parallel`` means WORLD_SIZE devices in one process.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from strategies.errors import ConfigurationError
from trainer.cli.common import command_parser, positive_int
from trainer.memory import STRATEGIES, report


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer estimate-memory``."""
    parser = command_parser(subparsers, "estimate-memory", "per-device memory of a module under each strategy",
                            __doc__)  # fmt: skip
    parser.add_argument("module", help="path/to/file.py:ClassName or package.module:ClassName")
    parser.add_argument("--world-size", type=positive_int, default=1, metavar="N")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--optimizer", default="adam", help="adam, adamw, sgd, sgd_momentum, rmsprop, adagrad")
    parser.add_argument("--device-memory", default=None, metavar="SIZE", help="e.g. 80GB: also recommend a strategy")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), metavar="NAME[,NAME]")
    parser.add_argument("--wrap", default="", metavar="CLASS[,CLASS]",
                        help="FSDP units: the names of the module classes to wrap, e.g. --wrap Block")  # fmt: skip
    parser.set_defaults(handler=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Print the table (and the recommendation when ``--device-memory`` is given)."""
    cls = load_class(args.module)
    with torch.device("meta"):
        module = cls()
    strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    wrap = {name.strip() for name in args.wrap.split(",") if name.strip()}
    unknown = wrap - {type(m).__name__ for m in module.modules()}
    if unknown:
        raise ConfigurationError(f"--wrap {args.wrap}: {args.module} has no submodule of class {sorted(unknown)}.")
    policy = (lambda m: type(m).__name__ in wrap) if wrap else None
    print(report(module, args.world_size, args.device_memory, strategies=strategies, precision=args.precision,
                 optimizer=args.optimizer, example_input=getattr(module, "example_input_array", None),
                 auto_wrap_policy=policy))  # fmt: skip
    return 0


def load_class(spec: str) -> type:
    """``path/to/module.py:ClassName`` or ``package.module:ClassName`` → the class."""
    target, _, name = spec.partition(":")
    if not name:
        raise ConfigurationError(f"'{spec}' must be 'path/to/file.py:ClassName' or 'package.module:ClassName'.")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ConfigurationError(f"'{target}' does not exist.")
        sys.path.insert(0, str(path.resolve().parent))
        spec_obj = importlib.util.spec_from_file_location(path.stem, path)
        loaded = importlib.util.module_from_spec(spec_obj)
        spec_obj.loader.exec_module(loaded)
    else:
        loaded = importlib.import_module(target)
    cls = getattr(loaded, name, None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise ConfigurationError(f"'{spec}': {name!r} is not an nn.Module class in {target}.")
    return cls
