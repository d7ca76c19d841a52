"""Checking a value read from YAML or a command line against a parameter's type hint, and naming what was expected.

Shared by ``TrainerCLI`` (:mod:`trainer.trainer_cli`), the experiment-file checks (:mod:`trainer.config.yaml_config`)
and the "did you mean" of misspelt Trainer arguments (:mod:`trainer.config.launch_defaults`).
"""
from __future__ import annotations

import difflib
import inspect
import typing
from typing import Any, Iterable, Mapping, Union


def fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` (as YAML read it) fits type hint ``hint``; hints it cannot judge are accepted."""
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    origin = typing.get_origin(hint)
    if origin is Union or type(hint).__name__ == "UnionType":
        return any(fits(arg, value) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, set, typing.Sequence) or hint in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin in (dict, typing.Mapping) or hint is dict:
        return isinstance(value, Mapping)
    return True  # classes, callables, ...: the constructor judges (class_path entries are built first)


def hint_name(hint: Any) -> str:
    """``Optional[int]`` → ``"Optional[int]"`` (the hint as written in the signature)."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


_WORDS = {bool: "true/false", int: "an int", float: "a number", str: "a string", type(None): "null",
          list: "a list", tuple: "a list", dict: "a mapping"}  # fmt: skip


def describe(hint: Any) -> str:
    """What a YAML value must be to fit ``hint``, in words: ``Optional[int]`` → ``"an int or null"``."""
    origin = typing.get_origin(hint)
    if origin is Union or type(hint).__name__ == "UnionType":
        words: list[str] = []
        for arg in typing.get_args(hint):
            word = describe(arg)
            if word not in words:
                words.append(word)
        return " or ".join(words)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(hint))
    for kind, word in _WORDS.items():
        if hint is kind or origin is kind:
            return word
    if origin in (typing.Sequence, set) or hint is set:
        return "a list"
    if origin is typing.Mapping:
        return "a mapping"
    return f"a {hint_name(hint)}"


def did_you_mean(key: str, valid: Iterable[str]) -> str:
    """``" Did you mean 'max_epochs'?"`` for the closest valid name, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(key), list(valid), n=1)
    return f" Did you mean '{close[0]}'?" if close else ""
