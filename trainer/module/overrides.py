"""Which methods a user's class implements: the hooks to call, the dataloader methods to ask, the steps to run."""
from __future__ import annotations

from typing import Any


def overrides(obj: Any, base: type, name: str) -> bool:
    """True when ``type(obj)`` (or the instance itself) defines ``name`` differently from ``base``. An instance
    attribute set to ``None`` (Lightning's ``model.validation_step = None``) switches the method off: False."""
    own = getattr(obj, "__dict__", {})
    if name in own:
        return own[name] is not None
    impl = getattr(type(obj), name, None)
    return impl is not None and impl is not getattr(base, name, None)
