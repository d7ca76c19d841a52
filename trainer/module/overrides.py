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
    """True when ``type(obj)`` (or the instance itself) defines ``name`` differently from ``base``: what the Trainer
    calls. An instance attribute counts (a recording or profiling wrapper set on the instance is called, as Lightning
    calls every hook); one set to ``None`` (Lightning's ``model.validation_step = None``) switches the method off."""
    own = getattr(obj, "__dict__", {})
    if name in own:
        return own[name] is not None
    impl = getattr(type(obj), name, None)
    return impl is not None and impl is not getattr(base, name, None)


def implements(obj: Any, base: type, name: str) -> bool:
    """Lightning's ``is_overridden``: like :func:`overrides`, except that an instance attribute that only wraps the
    inherited method (``functools.partial``/``wraps`` around it) is not an implementation. Used where Lightning asks
    it to choose between two implementations (a DataModule's batch-transfer hooks or the module's)."""
    own = getattr(obj, "__dict__", {})
    if name in own:
        if own[name] is None:
            return False
        code = getattr(_unwrapped(own[name]), "__code__", None)
        base_code = getattr(_unwrapped(getattr(base, name, None)), "__code__", None)
        return code is None or base_code is None or code is not base_code
    return overrides(obj, base, name)
