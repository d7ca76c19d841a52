"""``training_step`` returning ``None`` (no backward for this batch) under several ranks: every rank must do so together.

A rank that skips runs no backward, so it misses the gradient all-reduce the other ranks run: the collectives no
longer pair up and the job hangs or aborts far from the cause. Where a skip is possible, that is where
``training_step``'s source can return ``None`` (a ``return None``, a bare ``return``, or an end it can fall off),
the ranks agree on it before the backward: one tiny all-gather per micro-batch, and a host read of it. Every rank
then skips the backward together (and takes the window's empty optimizer step together, as Lightning counts it),
or all raise the same error naming the ranks that skipped. A ``training_step`` that always returns a value pays
nothing.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Callable

import torch

from trainer.strategies.errors import ConfigurationError


def can_return_none(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s source has a path that returns ``None`` (``False`` when the source cannot be read)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return False
    function = next((node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))),
                    None)  # fmt: skip
    if function is None:
        return False
    return _returns_none(function.body) or not _always_returns(function.body)


def _returns_none(body: list[ast.stmt]) -> bool:
    for statement in body:
        for node in _walk_own(statement):
            if isinstance(node, ast.Return) and (node.value is None or
                                                 (isinstance(node.value, ast.Constant) and node.value.value is None)):
                return True
    return False


def _walk_own(node: ast.AST):
    """``ast.walk`` that does not enter nested functions, lambdas or classes."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            yield from _walk_own(child)


def _always_returns(body: list[ast.stmt]) -> bool:
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return _always_returns(last.body) and _always_returns(last.orelse)
    if isinstance(last, (ast.With, ast.AsyncWith)):
        return _always_returns(last.body)
    if isinstance(last, ast.Try):
        return _always_returns(last.body) and all(_always_returns(h.body) for h in last.handlers)
    return False


def agree_on_skip(strategy: Any, skipped: bool, progress: Any) -> bool:
    """Every rank calls this with whether its ``training_step`` returned ``None``; returns whether all did.
    Raises on every rank when only some did."""
    flags = strategy.all_gather(torch.tensor([int(skipped)], device=strategy.root_device)).flatten().tolist()
    if all(flags):
        return True
    if not any(flags):
        return False
    where = f"global step {progress.global_step} (epoch {progress.epoch}, batch {progress.batch_in_epoch})"
    ranks = [rank for rank, flag in enumerate(flags) if flag]
    others = [rank for rank, flag in enumerate(flags) if not flag]
    named = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    raise ConfigurationError(
        f"training_step returned None on {named} only, at {where}; rank(s) {', '.join(map(str, others))} returned a "
        "loss. Skipping the batch on some ranks is a mismatched collective: the others' backward runs a gradient "
        "all-reduce that the skipping rank never joins, so the job would hang. Return a loss on every rank, or "
        "make the skip decision the same on every rank, e.g. skip = self.trainer.strategy.reduce_boolean_decision("
        "flag, all=False)."
    )
