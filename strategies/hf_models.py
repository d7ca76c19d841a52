"""Hugging Face ``transformers`` models found inside a module, and what they carry for a parallel layout.

A model of ``transformers`` names its repeated blocks (``_no_split_modules``: the FSDP units and the blocks to
checkpoint) and, for many architectures, its tensor-parallel plan (``_tp_plan`` / ``config.base_model_tp_plan``).
Nothing here imports ``transformers``: a module can hold a Hugging Face model only once ``transformers`` was
imported, so when it is not in ``sys.modules`` there is nothing to find.
"""
from __future__ import annotations

import sys
from typing import Any

from torch import nn


def is_hf_model(module: Any) -> bool:
    """True for an instance of ``transformers.PreTrainedModel`` (without importing ``transformers``)."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    base = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    return base is not None and isinstance(module, base)


def hf_models(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost Hugging Face models in ``module`` (itself included), with their names (``""`` for itself);
    a model inside another (a ``LlamaForCausalLM``'s ``LlamaModel``) is not listed again."""
    if sys.modules.get("transformers") is None:
        return []
    found: list[tuple[str, nn.Module]] = []
    inside: set[int] = set()
    for name, sub in module.named_modules():
        if id(sub) in inside:
            continue
        if is_hf_model(sub):
            found.append((name, sub))
            inside.update(id(m) for m in sub.modules())
    return found


def no_split_classes(module: nn.Module) -> tuple[type, ...]:
    """The classes named in the ``_no_split_modules`` of every Hugging Face model inside ``module`` (the
    transformer blocks), as the classes present in it; ``()`` when it holds no such model."""
    names: set[str] = set()
    for _, model in hf_models(module):
        names.update(getattr(model, "_no_split_modules", None) or ())
    if not names:
        return ()
    return tuple(dict.fromkeys(type(m) for m in module.modules() if type(m).__name__ in names))
