"""Which methods a user's class implements: the hooks to call, the dataloader methods to ask, the steps to run."""
from __future__ import annotations

import functools
from typing import Any


def _unwrapped(fn: Any) -> Any:
    """The function under ``functools.wraps``/``update_wrapper``, ``functools.partial`` and bound-method layers."""
    for _ in range(8):  # a few layers at most; a cycle of __wrapped__ must not hang
        if hasattr(fn, "__wrapped__"):  # first: a partial made to look like the hook wraps that hook
            fn = fn.__wrapped__
        elif isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__func__"):
            fn = fn.__func__
        else:
            break
    return fn


def overrides(obj: Any, base: type, name: str) -> bool:
    """True when ``type(obj)`` (or the instance itself) defines ``name`` differently from ``base``. An instance
    attribute set to ``None`` (Lightning's ``model.validation_step = None``) switches the method off: False. An
    instance attribute that only wraps the inherited method (``functools.partial``/``wraps`` around it, as a
    recording or profiling wrapper does) is not an override, as in Lightning."""
    own = getattr(obj, "__dict__", {})
    if name in own:
        if own[name] is None:
            return False
        code = getattr(_unwrapped(own[name]), "__code__", None)
        base_code = getattr(_unwrapped(getattr(base, name, None)), "__code__", None)
        return code is None or base_code is None or code is not base_code
    impl = getattr(type(obj), name, None)
    return impl is not None and impl is not getattr(base, name, None)
