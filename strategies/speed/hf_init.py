"""Hugging Face ``transformers`` models initialise themselves while built on ``meta``, as they do on a device.

``PreTrainedModel.init_weights()`` (run by ``post_init()`` at the end of every model's ``__init__``) skips the
model's own ``_init_weights`` when ``transformers.modeling_utils.get_torch_context_manager_or_global_device()``
reports the ``meta`` device: on a real device the model gets ``_init_weights``' values (N(0, 0.02) embeddings,
scaled projections), on ``meta`` it would keep its layers' ``reset_parameters()`` values. While a build is
recorded, :func:`real_device_for_transformers` makes that function report the device the build stands for, so the
model runs the same initialisation, in the same order, as on that device, and the recording sees every draw.

Nothing is imported: the patch is applied to ``transformers.modeling_utils`` if it is loaded already, else the
moment it is (the user's ``configure_model`` often imports it), and removed when the build ends.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any, Iterator, Optional

import torch

_MODULE = "transformers.modeling_utils"
_FUNCTION = "get_torch_context_manager_or_global_device"
_active: list[torch.device] = []  # the devices of the builds in progress (innermost last)


def _patch(module: Any) -> None:
    original = getattr(module, _FUNCTION, None)
    if original is None or getattr(original, "_reports_build_device", False):
        return

    def reported() -> Optional[torch.device]:
        device = original()
        if _active and device is not None and device.type == "meta":
            return _active[-1]
        return device

    reported._reports_build_device = True  # type: ignore[attr-defined]
    reported._original = original  # type: ignore[attr-defined]
    setattr(module, _FUNCTION, reported)


def _unpatch(module: Any) -> None:
    patched = getattr(module, _FUNCTION, None)
    if getattr(patched, "_reports_build_device", False):
        setattr(module, _FUNCTION, patched._original)


class _Loader(importlib.abc.Loader):
    """Loads the module as its own loader would, then patches it."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    def create_module(self, spec: Any) -> Any:
        return self.wrapped.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.wrapped.exec_module(module)
        if _active:
            _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``transformers.modeling_utils`` through the other finders and wraps its loader."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_FINDER = _Finder()


@contextlib.contextmanager
def real_device_for_transformers(device: torch.device) -> Iterator[None]:
    """While active, ``transformers`` sees ``device`` where the build's ``meta`` device is (see module doc)."""
    _active.append(device)
    if len(_active) == 1:
        sys.meta_path.insert(0, _FINDER)
    module = sys.modules.get(_MODULE)
    if module is not None:
        _patch(module)
    try:
        yield
    finally:
        _active.pop()
        if not _active:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(_FINDER)
            module = sys.modules.get(_MODULE)
            if module is not None:
                _unpatch(module)
