"""``trainer config``: write an experiment file (launch settings and Trainer arguments) for ``trainer run``.

On a terminal it asks for every setting not given as a flag; otherwise (or with ``--yes``) flags and
defaults are used. The file is read back by ``trainer run --config`` and ``Trainer.from_config``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision import precision_plugin
from trainer.strategies.registry import strategy_names
from trainer.cli.common import command_parser, non_negative_int, parse_env, port, positive_int, value_options
from trainer.config.yaml_config import ExperimentConfig, check_launch_value, dump_config, parse_value, split_trainer_args

HEADER = "# Written by `trainer config`. Use it with: trainer run --config {path} train.py\n"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer config``."""
    parser = command_parser(subparsers, "config", "write a launch/experiment config file", __doc__)
    parser.add_argument("--output", "-o", default="trainer.yaml", metavar="FILE",
                        help="where to write (default trainer.yaml)")  # fmt: skip
    parser.add_argument("--num-nodes", type=positive_int, metavar="N")
    parser.add_argument("--devices", type=positive_int, metavar="N", help="processes per node (one per GPU)")
    parser.add_argument("--node-rank", type=non_negative_int, metavar="R", help="this machine's node index")
    parser.add_argument("--main-address", metavar="HOST", help="host of node 0")
    parser.add_argument("--main-port", type=port, metavar="PORT")
    parser.add_argument("--max-restarts", type=non_negative_int, metavar="K")
    parser.add_argument("--precision", metavar="P", help="e.g. 32-true, 16-mixed, bf16-mixed")
    parser.add_argument("--strategy", metavar="S", help="e.g. auto, ddp")
    parser.add_argument("--env", action="append", default=None, metavar="KEY=VALUE",
                        help="extra environment variable (repeatable)")  # fmt: skip
    parser.add_argument("--yes", "-y", action="store_true", help="never prompt: take defaults for what is not given")
    parser.add_argument("--force", "--overwrite", action="store_true",
                        help="replace FILE when it exists (otherwise an existing file is never touched)")  # fmt: skip
    parser.set_defaults(handler=main)
    return parser


# ---------------------------------------------------------------------------------------------- value checks
def check_precision(value: Any) -> Any:
    """A precision the Trainer accepts (the Trainer's own check raises otherwise)."""
    precision_plugin(value)
    return value


def check_strategy(value: Any) -> str:
    """``"auto"`` or a registered strategy name."""
    valid = ["auto", *strategy_names()]
    if value not in valid:
        raise ConfigurationError(f"strategy={value!r} is not known. Valid values: {', '.join(valid)}.")
    return value


# ---------------------------------------------------------------------------------------------- prompting
def ask(question: str, default: Any, convert: Callable[[str], Any], read: Callable[[str], str] = input) -> Any:
    """Ask until the answer converts; an empty answer takes ``default``."""
    shown = "" if default is None else f" [{default}]"
    while True:
        answer = read(f"{question}{shown}: ").strip()
        if not answer:
            return default
        try:
            return convert(answer)
        except (ConfigurationError, argparse.ArgumentTypeError, ValueError) as err:
            print(f"  {err}", file=sys.stderr)


def _launch(key: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        return check_launch_value(key, parse_value(text), "answer")

    return convert


def _env_answer(text: str) -> dict[str, str]:
    return parse_env([item.strip() for item in text.split(",") if item.strip()])


def _precision_answer(text: str) -> Any:
    return check_precision(parse_value(text))


def build_config(args: argparse.Namespace, interactive: bool, read: Callable[[str], str] = input) -> ExperimentConfig:
    """The config from the flags, asking (when ``interactive``) for each setting no flag gave."""
    config = ExperimentConfig()
    given: set[str] = set()

    def setting(key: str, question: str, default: Any, convert: Callable[[str], Any], flag: Any) -> Any:
        if flag is not None:
            given.add(key)
            return flag
        if interactive:
            value = ask(question, default, convert, read)
            if value != default:
                given.add(key)
            return value
        return default

    config.num_nodes = setting("num_nodes", "How many machines (nodes)?", 1, _launch("num_nodes"), args.num_nodes)
    config.devices = setting("devices", "How many processes per machine (one per GPU)?", _default_devices(),
                             _launch("devices"), args.devices)  # fmt: skip
    if config.num_nodes > 1 or args.node_rank is not None or args.main_address is not None:
        config.node_rank = setting("node_rank", f"Rank of this machine (0..{config.num_nodes - 1})?", 0,
                                   _launch("node_rank"), args.node_rank)  # fmt: skip
        config.main_address = setting("main_address", "Address of machine 0 (IP or host name)?", "127.0.0.1",
                                      _launch("main_address"), args.main_address)  # fmt: skip
    config.main_port = setting("main_port", "Port on machine 0 (empty: a free port on one machine, 29500 on several)?",
                               None, _launch("main_port"), args.main_port)  # fmt: skip
    config.max_restarts = setting("max_restarts", "Restart the workers how many times after a failure?", 0,
                                  _launch("max_restarts"), args.max_restarts)  # fmt: skip
    precision_flag = None if args.precision is None else check_precision(args.precision)
    precision = setting("precision", "Precision (32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, 64-true)?",
                        "32-true", _precision_answer, precision_flag)  # fmt: skip
    strategy = setting("strategy", "Strategy (auto, ddp, ...)?", "auto", check_strategy,
                       None if args.strategy is None else check_strategy(args.strategy))  # fmt: skip
    config.env = setting("env", "Extra environment variables (KEY=VALUE, comma separated)?", {}, _env_answer,
                         None if args.env is None else parse_env(args.env))  # fmt: skip
    config.trainer = {"precision": precision, "strategy": strategy}
    if config.node_rank >= config.num_nodes:
        raise ConfigurationError(
            f"node_rank={config.node_rank} must be in 0..{config.num_nodes - 1} for num_nodes={config.num_nodes}."
        )
    config.given = frozenset(given | {"num_nodes", "devices"})
    return config


def _default_devices() -> int:
    import torch

    return max(torch.cuda.device_count(), 1)


def main(args: argparse.Namespace, read: Optional[Callable[[str], str]] = None) -> int:
    """Write the file and say how to use it."""
    path = Path(args.output)
    if path.exists() and not args.force:
        raise ConfigurationError(
            f"{path} exists and would be replaced, with any sections written by hand. Write elsewhere (-o FILE) or "
            "pass --force to replace it."
        )
    interactive = not args.yes and sys.stdin.isatty() and sys.stdout.isatty()
    config = build_config(args, interactive, read or input)
    if args.trainer_args:
        config.trainer.update(args.trainer_args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER.format(path=path) + dump_config(config))
    print(f"Wrote {path}. Launch with: trainer run --config {path} train.py")
    return 0


def split_argv(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str], list[str]]:
    """``trainer config`` also takes ``--trainer.*`` arguments, written to the file's ``trainer:`` section."""
    rest, tokens = split_trainer_args(argv, value_options(parser), stop_at_positional=False)
    return rest, tokens, []
