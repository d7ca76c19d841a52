"""``check_init``: compare each rank's materialised parameters and buffers with the eager one-device build.

For users who want proof on their own model, and for our tests over many architectures: every tensor this rank
holds (its local shard of a ``DTensor``, its pipeline stage's tensors) must equal, bit for bit, the same part of the
reference tensor an eager build on one device gave (:func:`~trainer.strategies.speed.module_build.eager_reference`),
after the precision's conversion. The first that differs is named.
"""
from __future__ import annotations

import itertools

import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError

#: Name segments wrappers add to a module's parameter names (activation checkpointing, torch.compile).
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


class InitMismatchError(ConfigurationError):
    """``check_init``: a tensor after deferred initialisation differs from the eager build of the same code."""


def _plain_name(name: str) -> str:
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def verify_initial_weights(module: nn.Module, reference: dict[str, torch.Tensor]) -> int:
    """Raise :class:`InitMismatchError` naming the first tensor of ``module`` (this rank's part of it) that
    differs from ``reference``; return how many tensors were compared."""
    expected_by_name = {_plain_name(name): tensor for name, tensor in reference.items()}
    compared = 0
    with torch.no_grad():
        for name, tensor in itertools.chain(module.named_parameters(remove_duplicate=False),
                                            module.named_buffers(remove_duplicate=False)):  # fmt: skip
            plain = _plain_name(name)
            if plain not in expected_by_name:
                raise InitMismatchError(
                    f"check_init: {plain} exists after materialisation but the eager build has no tensor of that "
                    "name; the module built differently on the meta device than eagerly."
                )
            local, expected = _local_and_expected(tensor, expected_by_name[plain])
            if local.shape != expected.shape or not _same(local, expected):
                raise InitMismatchError(_describe(plain, local, expected))
            compared += 1
    return compared


def _local_and_expected(tensor: torch.Tensor, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(tensor, "device_mesh") and hasattr(tensor, "placements"):
        from torch.distributed.tensor import distribute_tensor

        local = tensor.to_local()
        full = full.to(device=local.device, dtype=local.dtype)
        expected = distribute_tensor(full, tensor.device_mesh, tensor.placements, src_data_rank=None).to_local()
        return local, expected
    return tensor, full.to(device=tensor.device, dtype=tensor.dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():  # NaN at the same places counts as equal
        both_nan = torch.isnan(a) & torch.isnan(b)
        return bool(torch.equal(torch.where(both_nan, 0, a), torch.where(both_nan, 0, b)))
    return False


def _describe(name: str, local: torch.Tensor, expected: torch.Tensor) -> str:
    if local.shape != expected.shape:
        detail = f"shape {tuple(local.shape)} instead of {tuple(expected.shape)}"
    else:
        differ = (local != expected).sum().item()
        detail = f"{differ} of {local.numel()} elements differ"
        if local.is_floating_point():
            gap = (local.double() - expected.double()).abs().nan_to_num(float("inf")).max().item()
            detail += f", largest difference {gap:.3g}"
    return (
        f"check_init: {name} after deferred initialisation differs from the eager one-device build of the same code "
        f"({detail}). The build on the meta device did not reproduce this tensor: usually code that does something "
        "else when it sees the meta device (it reads .is_meta or .device), else a construct the recording does not "
        "follow (please report it with the code). Build it with real tensors (trainer.init_module(empty_init=False)), "
        "or initialise it in init_weights(), which runs after the build on every layout."
    )
