"""What the layout tests share: the initial tensors a rank holds when training starts, the tensor-parallel mesh a
module sees in ``configure_model``, and the comparison of the ranks' reports with the one-device build."""
from __future__ import annotations

from typing import Any

import torch

from trainer import TrainModule
from trainer.callbacks import Callback


class InitialWeights(Callback):
    """The full value of every parameter (under each of its names) and buffer this rank holds, when training
    starts."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, module):
        for name, tensor in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers()):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            self.weights[name] = full.detach().clone()


def tp_mesh(module: TrainModule) -> Any:
    """The strategy's tensor-parallel sub-mesh (ours ``"tp"``, Lightning's ``"tensor_parallel"``) when larger than
    one, else ``None`` (one device: no plan to apply)."""
    mesh = module.device_mesh
    for name in ("tp", "tensor_parallel"):
        if mesh is not None and name in (mesh.mesh_dim_names or ()) and mesh[name].size() > 1:
            return mesh[name]
    return None


def merged(reports: list[dict], layout: str) -> dict[str, torch.Tensor]:
    """The whole model from the ranks' full tensors (each pipeline stage holds part of it)."""
    whole: dict[str, torch.Tensor] = {}
    for report in reports:
        for name, value in report[layout].items():
            assert name not in whole or torch.equal(whole[name], value), f"{layout}: ranks disagree on {name}"
            whole[name] = value
    return whole


def assert_bit_identical(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], layout: str) -> None:
    assert sorted(weights) == sorted(expected), layout
    for name, value in expected.items():
        assert weights[name].dtype == value.dtype and torch.equal(weights[name], value), f"{layout}: {name} differs"
