"""``activation_checkpointing=``: named block classes keep only their inputs for backward and recompute the
rest (``torch.utils.checkpoint``, non-reentrant), trading one extra forward per block for their activations.
``"auto"`` takes the blocks of a Hugging Face model from its ``_no_split_modules``.

The checkpointed forward is installed on each block instance, in place: module structure, parameter names and
checkpoints stay exactly as without it, and the same blocks work one process, under DDP and inside FSDP2 units
(where the recompute runs after FSDP has gathered the block's parameters for its backward). The random state is
saved and restored around the recompute, so dropout masks match the first forward and so do the gradients.
``torch.compile`` traces the checkpointed region (Dynamo's checkpoint operator), so the two combine.

:class:`SavedTensorBytes` measures what autograd keeps for backward, to see the saving on any device.
"""
from __future__ import annotations

import types
from typing import Any, Iterable, Union

from torch import nn

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.hf_models import no_split_classes

BlockClasses = Union[None, str, type, Iterable[Union[str, type]]]


def check_block_classes(value: BlockClasses, argument: str = "activation_checkpointing") -> tuple[Any, ...]:
    """The block classes (names or ``nn.Module`` subclasses) as a tuple; ``()`` when off."""
    if value is None or value is False:
        return ()
    items = [value] if isinstance(value, (str, type)) else value
    try:
        items = list(items)
    except TypeError:
        items = None
    if not items or not all(isinstance(c, str) or (isinstance(c, type) and issubclass(c, nn.Module)) for c in items):
        raise ConfigurationError(
            f"{argument}={value!r} is not understood. Name the blocks to checkpoint by class name or class, "
            f"e.g. {argument}=['Block'] or {argument}=[TransformerBlock]."
        )
    return tuple(items)


class CheckpointedForward:
    """A block's forward run under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``."""

    def __init__(self, module: nn.Module, inner: Any = None) -> None:
        self.inner = inner if inner is not None else types.MethodType(type(module).forward, module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def _matches(module: nn.Module, classes: tuple[Any, ...]) -> bool:
    kind = type(module)
    return any(kind.__name__ == c or kind.__qualname__ == c if isinstance(c, str) else isinstance(module, c)
               for c in classes)  # fmt: skip


def apply_activation_checkpointing(module: nn.Module, block_classes: BlockClasses) -> list[nn.Module]:
    """Checkpoint every submodule of ``module`` whose class is named in ``block_classes``; returns those blocks.

    ``"auto"`` names the blocks a Hugging Face model inside ``module`` lists in its ``_no_split_modules``.
    Idempotent. Raises when nothing matches (listing the classes present), or when ``module`` itself matches.
    """
    classes = check_block_classes(block_classes)
    if not classes:
        return []
    if classes == ("auto",):
        classes = no_split_classes(module)
        if not classes:
            raise ConfigurationError(
                f"activation_checkpointing='auto' checkpoints the blocks a Hugging Face model names in its "
                f"_no_split_modules, and {type(module).__name__} holds no such model. Name the block classes instead, "
                "e.g. activation_checkpointing=['Block']."
            )
    if _matches(module, classes):
        raise ConfigurationError(
            f"activation_checkpointing names {type(module).__name__}, the module being trained: checkpointing all of "
            "it saves nothing. Name the repeated blocks inside it (e.g. the transformer layer class)."
        )
    blocks = [m for m in module.modules() if m is not module and _matches(m, classes)]
    if not blocks:
        present = sorted({type(m).__name__ for m in module.modules() if m is not module})
        raise ConfigurationError(
            f"activation_checkpointing={list(c if isinstance(c, str) else c.__name__ for c in classes)} matched no "
            f"submodule of {type(module).__name__}. Its submodule classes are: {present}."
        )
    for block in blocks:
        if not isinstance(block.__dict__.get("forward"), CheckpointedForward):
            block.forward = CheckpointedForward(block, block.__dict__.get("forward"))
    return blocks


class SavedTensorBytes:
    """Context manager counting the bytes autograd saves for backward inside it (``saved_tensors_hooks``).

    ``with SavedTensorBytes() as saved: loss = model(x).sum()`` then ``saved.bytes``. Tensors a checkpointed
    block saves are held by the checkpoint, not autograd, and are not counted: that is the saving. A tensor
    saved twice (e.g. by two ops) is counted once.
    """

    def __init__(self) -> None:
        self.bytes = 0
        self._seen: set[tuple[int, int]] = set()
        self._hooks: Any = None

    def _pack(self, tensor: Any) -> Any:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.device.type != "meta" else (id(tensor), 0)
        if key not in self._seen:
            self._seen.add(key)
            self.bytes += tensor.numel() * tensor.element_size()
        return tensor

    def __enter__(self) -> "SavedTensorBytes":
        from torch.autograd.graph import saved_tensors_hooks

        self._hooks = saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
