"""Rank-zero helpers usable before and after a process group exists."""
from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("trainer")
# INFO messages (seed set, early stopping, interrupted runs) show by default, as Lightning's do; an application
# that configures logging itself (a root handler) gets them through its own handlers instead.
log.setLevel(logging.INFO)
if not logging.getLogger().hasHandlers():
    log.addHandler(logging.StreamHandler())
    log.propagate = False

_RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "JSM_NAMESPACE_RANK")


def _rank_from_env() -> int:
    for key in _RANK_ENV_VARS:
        value = os.environ.get(key)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                pass
    return 0


def rank_zero_only(fn: F) -> F:
    """Decorate ``fn`` so it runs on global rank 0 only (and returns ``None`` elsewhere).

    The rank is read from the launcher's environment at import and updated by the strategy once the
    process group exists (``rank_zero_only.rank``).
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if rank_zero_only.rank == 0:
            return fn(*args, **kwargs)
        return None

    return wrapped  # type: ignore[return-value]


rank_zero_only.rank = _rank_from_env()  # type: ignore[attr-defined]


@rank_zero_only
def rank_zero_info(message: str, *args: Any) -> None:
    """Log ``message`` at INFO level on global rank 0 only."""
    log.info(message, *args)


@rank_zero_only
def rank_zero_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only."""
    print(*args, **kwargs)


class PossibleUserWarning(UserWarning):
    """A warning that may be a false positive (a setting that is often, but not always, a mistake); Lightning's
    category of the same name, so ``warnings.filterwarnings("ignore", category=PossibleUserWarning)`` silences
    them all at once."""


@rank_zero_only
def rank_zero_warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 3) -> None:
    """``warnings.warn`` on global rank 0 only."""
    warnings.warn(message, category, stacklevel=stacklevel)
