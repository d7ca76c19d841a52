"""A Hugging Face model's own tensor-parallel plan, as ``parallelize_module`` styles.

``transformers`` models of many architectures carry their plan as strings per module pattern: the causal LM's
``_tp_plan`` (``{"lm_head": "colwise_gather_output", "model.layers.*.self_attn.q_proj": "colwise", ...}``), built
from ``config.base_model_tp_plan`` under the base model's prefix. :func:`hf_tp_plan` turns it into torch's
``ParallelStyle`` objects with the meaning ``transformers`` gives each string (outputs of a plan's last layers are
whole tensors, so the model's forward and the user's loss stay as on one device). A model without a plan (GPT-2's
classes in ``transformers``) gets none: ``tp > 1`` then says what to give instead.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from trainer.strategies.errors import ConfigurationError


def _styles() -> dict[str, Callable[[], Any]]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": SequenceParallel,
    }


def raw_hf_plan(model: nn.Module) -> dict[str, str]:
    """The model's plan as ``transformers`` writes it (module pattern -> style name), keys relative to the model:
    its ``_tp_plan``, else the config's ``base_model_tp_plan`` under the base model's prefix; ``{}`` when none."""
    plan = dict(getattr(model, "_tp_plan", None) or {})
    if plan:
        return plan
    base = dict(getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {})
    prefix = getattr(model, "base_model_prefix", "")
    if base and prefix and hasattr(model, prefix) and getattr(model, prefix) is not model:
        base = {f"{prefix}.{key}": style for key, style in base.items()}
    return {**base, **dict(getattr(type(model), "_tp_plan", None) or {})}


def hf_tp_plan(model: nn.Module, prefix: str = "") -> dict[str, Any]:
    """``{module pattern: ParallelStyle}`` from the model's own plan, keys under ``prefix`` (the model's name in
    the module being trained). Raises, saying what to give, when the model has no plan or a style this cannot map."""
    raw = raw_hf_plan(model)
    name = type(model).__name__
    if not raw:
        raise ConfigurationError(
            f"tp > 1, but {name} carries no tensor-parallel plan (transformers gives its class no _tp_plan / "
            "base_model_tp_plan). Give one: NDParallelStrategy(tp=2, tp_plan={'model.lm_head': ColwiseParallel(), "
            "...}), module patterns relative to your TrainModule mapped to ParallelStyles (torch's Colwise/Rowwise "
            "styles split nn.Linear and nn.Embedding), or apply parallelize_module(..., self.device_mesh['tp'], "
            "plan) yourself in configure_model."
        )
    styles = _styles()
    unknown = sorted({style for style in raw.values() if style not in styles})
    if unknown:
        raise ConfigurationError(
            f"{name}'s tensor-parallel plan uses styles {unknown}, which have no torch ParallelStyle here (known: "
            f"{sorted(styles)}). Give your own plan: NDParallelStrategy(tp_plan={{...}}), or apply "
            "parallelize_module yourself in configure_model."
        )
    return {(f"{prefix}.{key}" if prefix else key): styles[style]() for key, style in raw.items()}


def tied_slots(module: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """(owner, name, first owner, first name) of every parameter slot holding a tensor an earlier slot holds."""
    first: dict[int, tuple[nn.Module, str]] = {}
    ties = []
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is None:
                continue
            if id(param) in first:
                ties.append((owner, name, *first[id(param)]))
            else:
                first[id(param)] = (owner, name)
    return ties


def retie(ties: list[tuple[nn.Module, str, nn.Module, str]]) -> None:
    """Tie again what ``parallelize_module`` untied (it gives each module a new parameter); both sides must be
    split alike (an embedding rowwise and its output head colwise: both dim 0)."""
    for owner, name, first_owner, first_name in ties:
        shared = first_owner._parameters[first_name]
        mine = owner._parameters[name]
        if mine is shared:
            continue
        if getattr(mine, "placements", None) != getattr(shared, "placements", None):
            raise ConfigurationError(
                f"The tensor-parallel plan splits the tied weights {first_name!r} and {name!r} differently "
                f"({getattr(shared, 'placements', None)} vs {getattr(mine, 'placements', None)}); give both modules "
                "styles that split the same dim, or untie them (tie_word_embeddings=False)."
            )
        owner._parameters[name] = shared


def refuse_pipelined_hf(module: nn.Module) -> None:
    """Pipeline parallel keeps a stage's layers and drops the others; a ``transformers`` model's forward runs every
    layer it was built with, so it cannot run as a stage: say so, and what works."""
    from trainer.strategies.hf_models import hf_models

    found = hf_models(module)
    if found:
        name = type(found[0][1]).__name__
        raise ConfigurationError(
            f"pp > 1 cuts the model into stages, but {name}'s forward (transformers) runs every layer it was built "
            "with and cannot run as a stage. Train it with dp_shard x tp (its own plan) instead, or write a forward "
            "that skips the layers another stage holds (as torchtitan's models do)."
        )
