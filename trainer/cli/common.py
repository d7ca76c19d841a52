"""Pieces shared by the launching commands: argument types, the config file + flags merge, the environment."""
from __future__ import annotations

import argparse
from typing import Any, Mapping, Optional

from trainer.strategies.errors import ConfigurationError
from trainer.config.yaml_config import ExperimentConfig, check_launch_value, launch_environment, load_config


def command_parser(
    subparsers: Any, name: str, summary: str, doc: str, trainer_args_where: str = ""
) -> argparse.ArgumentParser:
    """A sub-parser whose description is the command module's docstring (after its first line)."""
    epilog = (f"Trainer arguments: --trainer.KEY VALUE ({trainer_args_where}), e.g. --trainer.max_epochs 5."
              if trainer_args_where else None)  # fmt: skip
    return subparsers.add_parser(name, help=summary, description=doc.split("\n", 2)[2], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    return _int_at_least(text, 0)


def port(text: str) -> int:
    """argparse type: a TCP port."""
    value = _int_at_least(text, 1)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1..65535)")
    return value


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
    return value


def value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of ``parser`` that take a value (to tell a value from a positional argument)."""
    return {option for action in parser._actions if action.nargs != 0 for option in action.option_strings}


def merged_config(path: Optional[str], flags: Mapping[str, Any]) -> ExperimentConfig:
    """The config file (or defaults) with every flag that was given (not ``None``) on top, validated."""
    config = load_config(path)
    given = set(config.given)
    for key, value in flags.items():
        if value is not None:
            setattr(config, key, check_launch_value(key, value, "command line"))
            given.add(key)
    config.given = frozenset(given)
    return config


def parse_env(items: list[str]) -> dict[str, str]:
    """``["A=1", "B=x"]`` (``--env`` flags) → ``{"A": "1", "B": "x"}``."""
    env = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or " " in key.strip():
            raise ConfigurationError(f"--env {item!r} must look like KEY=VALUE (e.g. --env OMP_NUM_THREADS=1).")
        env[key.strip()] = value
    return env


def job_variables(
    config: ExperimentConfig, config_path: Optional[str], trainer_args: Mapping[str, Any]
) -> dict[str, str]:
    """What the launched processes need besides the inherited environment: the file's ``env:`` and what their
    Trainers read (``TRAINER_CONFIG``/``TRAINER_ARGS``).

    Launch settings that are also Trainer arguments (``devices``, ``num_nodes``) travel in ``TRAINER_ARGS`` so a
    plain ``Trainer()`` in the script joins a job of the size that was launched.
    """
    args = {key: getattr(config, key) for key in ("devices", "num_nodes") if key in config.given}
    for key, value in trainer_args.items():
        if key in args and value != args[key]:
            raise ConfigurationError(
                f"--trainer.{key} {value!r} contradicts the launch's {key}={args[key]!r} (a flag or the config file): "
                f"the job starts {args[key]} there. Set it once, with the launch flag."
            )
    args.update(trainer_args)
    return {**config.env, **launch_environment(config_path, args)}
