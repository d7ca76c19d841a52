"""Tensor-parallel plans: which dim of which parameter a ``parallelize_module`` plan splits, and a built-in plan.

A plan is what ``torch.distributed.tensor.parallel.parallelize_module(module, mesh, plan)`` takes: a dict of
module name or ``fnmatch`` pattern per dotted part (``"layers.*.attention.wq"``) to a ``ParallelStyle``
(``ColwiseParallel()``, ``RowwiseParallel()``, ``SequenceParallel()``, ``PrepareModuleInput(...)``, ...), or a
nested dict. :func:`resolve_tp_plan` matches it as ``parallelize_module`` does (but a key that matches
nothing is an error, not a warning); :func:`tp_shard_dims` reads each style's type to say which dim of each
parameter it shards (torch's rules: colwise shards a Linear's weight and bias on dim 0 and an Embedding's
weight on dim 1; rowwise a Linear's weight on dim 1, leaving its bias whole, and an Embedding's weight on dim
0; sequence parallel and the ``PrepareModule*`` styles shard no parameter). Parameters no style covers are
replicated across the tensor-parallel ranks.

:func:`megatron_plan` builds Megatron-LM's split for a stack of transformer blocks (see there).

Tied weights: ``parallelize_module`` gives each module its own new parameter, so a tied pair (an embedding and
the output head) comes out untied; tie it again afterwards (``model.lm_head.weight = model.wte.weight``),
which works only when both sides split the same dim (the head colwise, the embedding rowwise: both dim 0).
:func:`tp_shard_dims` refuses a plan that splits the two sides differently.
"""
from __future__ import annotations

from fnmatch import fnmatch
from typing import Any, Iterable, Optional

from torch import nn

from trainer.strategies.errors import ConfigurationError


def resolve_tp_plan(module: nn.Module, plan: Any) -> dict[str, Any]:
    """``{module name: ParallelStyle}`` for every module ``plan`` reaches, matched as ``parallelize_module``
    matches it. Raises for a key that matches no submodule and for two parameter-splitting styles on one module."""
    from torch.distributed.tensor.parallel import ParallelStyle

    resolved: dict[str, Any] = {}

    def apply(target: nn.Module, prefix: str, entry: Any, key: str) -> None:
        if isinstance(entry, ParallelStyle):
            earlier = resolved.get(prefix)
            if earlier is not None and _splits_parameters(earlier) and _splits_parameters(entry):
                raise ConfigurationError(
                    f"The TP plan applies both {type(earlier).__name__} and {type(entry).__name__} to "
                    f"'{prefix or type(module).__name__}' (key '{key}'); parallelize_module can split its parameters once."
                )
            if earlier is None or _splits_parameters(entry):
                resolved[prefix] = entry
            return
        if not isinstance(entry, dict):
            raise ConfigurationError(
                f"The TP plan's entry '{key}' is {type(entry).__name__}; use a ParallelStyle (ColwiseParallel(), "
                "RowwiseParallel(), SequenceParallel(), PrepareModuleInput(...)) or a dict of them."
            )
        for path, value in entry.items():
            if path == "":
                apply(target, prefix, value, key)
                continue
            matched = _match(target, path.split("."), prefix)
            if not matched:
                raise ConfigurationError(
                    f"The TP plan's key '{path}' matches no submodule of '{prefix or type(module).__name__}' "
                    f"(whose children are {[n for n, _ in target.named_children()][:8]}). Keys are module names "
                    "relative to the module, with fnmatch wildcards per dotted part, e.g. 'layers.*.mlp.fc1'."
                )
            for name, sub in matched:
                apply(sub, name, value, path)

    apply(module, "", plan, "<plan>")
    return resolved


def _match(target: nn.Module, tokens: list[str], prefix: str) -> list[tuple[str, nn.Module]]:
    found = []
    for child_name, child in target.named_children():
        if fnmatch(child_name, tokens[0]):
            name = f"{prefix}.{child_name}" if prefix else child_name
            found += [(name, child)] if len(tokens) == 1 else _match(child, tokens[1:], name)
    return found


def _splits_parameters(style: Any) -> bool:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return isinstance(style, (ColwiseParallel, RowwiseParallel))


def tp_shard_dims(module: nn.Module, resolved: dict[str, Any]) -> dict[str, Optional[int]]:
    """``{parameter name: the dim tensor parallel shards, or None (replicated)}`` for every parameter name
    (tied names too) under the resolved plan of :func:`resolve_tp_plan`."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    known = (ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, PrepareModuleOutput,
             PrepareModuleInputOutput)  # fmt: skip
    dims: dict[str, Optional[int]] = {name: None for name, _ in module.named_parameters(remove_duplicate=False)}
    for prefix, style in resolved.items():
        if not isinstance(style, known):
            raise ConfigurationError(
                f"The memory planner does not know the ParallelStyle {type(style).__name__} (on "
                f"'{prefix}'). It reads ColwiseParallel, RowwiseParallel, SequenceParallel and the PrepareModule* "
                "styles (and their subclasses)."
            )
        if not _splits_parameters(style):
            continue
        sub = module.get_submodule(prefix)
        colwise = isinstance(style, ColwiseParallel)
        if isinstance(sub, nn.Linear):
            split = {"weight": 0, "bias": 0} if colwise else {"weight": 1, "bias": None}
        elif isinstance(sub, nn.Embedding):
            split = {"weight": 1} if colwise else {"weight": 0}
        else:
            raise ConfigurationError(
                f"The TP plan applies {type(style).__name__} to '{prefix}', a {type(sub).__name__}; torch's "
                "ColwiseParallel and RowwiseParallel split nn.Linear and nn.Embedding only."
            )
        for local, _ in sub.named_parameters():
            dims[f"{prefix}.{local}" if prefix else local] = split.get(local, 0 if colwise else None)
    _check_tied(module, dims)
    return dims


def replicated_gradients(module: nn.Module, resolved: dict[str, Any]) -> set[str]:
    """Parameter names whose gradient torch materialises whole on every tensor-parallel rank although the
    parameter is sharded: the weight of a ``RowwiseParallel`` ``nn.Embedding`` (its backward returns a
    ``Replicate()`` gradient in this torch version; FSDP's reduce-scatter shards it again)."""
    from torch.distributed.tensor.parallel import RowwiseParallel

    return {f"{prefix}.weight" if prefix else "weight" for prefix, style in resolved.items()
            if isinstance(style, RowwiseParallel) and isinstance(module.get_submodule(prefix), nn.Embedding)}  # fmt: skip


def _check_tied(module: nn.Module, dims: dict[str, Optional[int]]) -> None:
    first: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), name)
        if dims[owner] != dims[name]:
            def say(n: str) -> str:
                return "keeps it whole" if dims[n] is None else f"splits dim {dims[n]}"

            raise ConfigurationError(
                f"'{owner}' and '{name}' are one tensor (tied weights), but the TP plan {say(owner)} for '{owner}' and "
                f"{say(name)} for '{name}'. Give both modules styles that split the same dim (an output head "
                "ColwiseParallel() and its embedding RowwiseParallel() both split dim 0), or untie them."
            )


# ---------------------------------------------------------------------------------------------- built-in plan
def block_modules(module: nn.Module, block_classes: Iterable[type] = ()) -> list[tuple[str, nn.Module]]:
    """The transformer blocks: instances of ``block_classes``, or (none given) the children of the largest
    ``nn.ModuleList`` or ``nn.ModuleDict`` whose children are all of one class."""
    classes = tuple(block_classes)
    if classes:
        return [(n, m) for n, m in module.named_modules() if isinstance(m, classes)]
    best: list[tuple[str, nn.Module]] = []
    for name, sub in module.named_modules():
        children = list(sub.named_children())
        if isinstance(sub, (nn.ModuleList, nn.ModuleDict)) and len(children) > max(1, len(best)):
            if len({type(c) for _, c in children}) == 1:
                best = [(f"{name}.{n}" if name else n, c) for n, c in children]
    return best


def megatron_plan(module: nn.Module, block_classes: Iterable[type] = ()) -> dict[str, Any]:
    """Megatron-LM's tensor-parallel split as a ``parallelize_module`` plan.

    In each block (``block_classes``, or found as the children of the largest ``nn.ModuleList``/``ModuleDict``), with ``d``
    the width its first Linear reads: a Linear widening ``d`` (q/k/v, fused qkv, the MLP's up and gate
    projections) is ``ColwiseParallel()``, one narrowing back to ``d`` (the MLP's down projection) is
    ``RowwiseParallel()``; a square ``d -> d`` Linear is rowwise when it is the last Linear of its submodule
    (the attention output projection), colwise otherwise. Outside the blocks, the Linear with the most outputs
    (the head) is ``ColwiseParallel(use_local_output=False)`` (its logits stay a vocabulary-sharded DTensor:
    compute the loss under ``torch.distributed.tensor.parallel.loss_parallel()``), and an Embedding tied to it
    or as large as its vocabulary is ``RowwiseParallel(input_layouts=Replicate())`` (every rank gets all token
    ids). Norms, position embeddings and everything else stay replicated. The blocks of one list give
    wildcard keys (``"transformer.h.*.attn.c_attn"``).
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    blocks = block_modules(module, block_classes)
    if not blocks:
        raise ConfigurationError(
            f"The 'megatron' TP plan needs transformer blocks, and {type(module).__name__} has no nn.ModuleList of "
            "blocks of one class. Name their class (--wrap Block / block_classes=...) or give your own plan."
        )
    plan: dict[str, Any] = {}
    in_blocks: set[int] = set()
    for block_name, block in blocks:
        for rel, style in _block_plan(block).items():
            plan[_pattern(module, block_name, blocks) + "." + rel] = style
        in_blocks.update(id(m) for m in block.modules())
    outside = [(n, m) for n, m in module.named_modules() if id(m) not in in_blocks]
    linears = [(n, m) for n, m in outside if isinstance(m, nn.Linear)]
    head = max(linears, key=lambda item: item[1].out_features, default=None)
    entries: dict[str, Any] = {}
    if head is not None:
        for name, sub in outside:
            if isinstance(sub, nn.Embedding) and (sub.weight is head[1].weight or sub.num_embeddings == head[1].out_features):
                entries[name] = RowwiseParallel(input_layouts=Replicate())
    entries.update(plan)
    if head is not None:
        entries[head[0]] = ColwiseParallel(use_local_output=False)
    return entries


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as Python source (one ``key: Style(...)`` line each, only the arguments that differ from the
    style's defaults), to paste into a ``parallelize_module`` call."""
    return "\n".join(f"{key!r}: {describe_style(style)}," for key, style in plan.items())


def describe_style(style: Any) -> str:
    """``RowwiseParallel(input_layouts=Replicate())``: the constructor call that makes ``style``."""
    default = type(style)()
    shown = []
    for attr, arg in (("input_layouts", "input_layouts"), ("output_layouts", "output_layouts"),
                      ("use_local_output", "use_local_output")):  # fmt: skip
        value, usual = getattr(style, attr, None), getattr(default, attr, None)
        if value != usual:
            value = value[0] if isinstance(value, tuple) and len(value) == 1 else value
            shown.append(f"{arg}={_placement(value)}")
    return f"{type(style).__name__}({', '.join(shown)})"


def _placement(value: Any) -> str:
    text = repr(value)
    return text.replace("Shard(dim=", "Shard(") if "Shard(dim=" in text else text


def _block_plan(block: nn.Module) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    linears = [(n, m) for n, m in block.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        return {}
    width = linears[0][1].in_features
    last_of_group: dict[str, str] = {}
    for name, _ in linears:
        last_of_group[name.split(".")[0] if "." in name else ""] = name
    plan: dict[str, Any] = {}
    for name, linear in linears:
        group = name.split(".")[0] if "." in name else ""
        widens, narrows = linear.in_features == width, linear.out_features == width
        if widens and narrows:
            plan[name] = RowwiseParallel() if last_of_group[group] == name else ColwiseParallel()
        elif widens:
            plan[name] = ColwiseParallel()
        elif narrows:
            plan[name] = RowwiseParallel()
    return plan


def _pattern(module: nn.Module, block_name: str, blocks: list[tuple[str, nn.Module]]) -> str:
    """``transformer.h.*`` when every child of the block's parent is a block of the same structure, else the
    block's own name."""
    parent, _, _ = block_name.rpartition(".")
    names = {n for n, _ in blocks}
    children = [f"{parent}.{n}" if parent else n for n, _ in module.get_submodule(parent).named_children()]
    structures = {tuple(n for n, _ in m.named_modules()) for n, m in blocks if n in children}
    return f"{parent}.*" if parent and set(children) <= names and len(structures) == 1 else block_name
