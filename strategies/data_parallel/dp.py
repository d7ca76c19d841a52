"""``strategy="dp"``: one process splits every batch across the GPUs of one machine (``torch.nn.DataParallel``).

Limits, and why ``"ddp"`` is the better choice almost always:

- CUDA only, one node only. On a machine without GPUs it refuses (use ``"ddp"``, which runs ``devices=N``
  CPU processes with gloo).
- One Python process drives every GPU: the module is copied to every GPU on every step and the
  forward runs in threads under the GIL, so it is typically much slower than DDP on the same GPUs.
- ``training_step`` runs once per GPU, each on its slice of the batch (tensors split along dim 0), in
  parallel threads. The loss (or the ``"loss"`` entry) is averaged over the slices, which equals the
  batch mean only when the slices are equal in size. ``self.log`` inside ``training_step`` therefore runs
  once per replica, concurrently: log from ``on_train_batch_end`` instead, or use DDP.
- Validation, test and predict steps run unsplit on the first GPU.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from trainer.strategies.checkpoint.whole_folder import WholeFolderLoading
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision import Precision
from trainer.strategies.strategy import Strategy


class _TrainingStep(nn.Module):
    """``forward`` is the wrapped module's ``training_step``; DataParallel replicates this whole object, so each
    replica's step runs on that replica's parameters."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any) -> Any:
        return self.module.training_step(*args)


def average_replicas(output: Any, replicas: int) -> Any:
    """Turn DataParallel's gathered step output (one loss per replica) into one loss."""
    if replicas == 1:
        return output
    if isinstance(output, Tensor) and output.ndim == 1 and output.numel() == replicas:
        return output.mean()
    if isinstance(output, dict) and isinstance(output.get("loss"), Tensor):
        return {**output, "loss": average_replicas(output["loss"], replicas)}
    return output


class DataParallelStrategy(WholeFolderLoading, Strategy):
    """Split each batch across the GPUs of this machine in one process. See the module docstring for its limits."""

    strategy_name = "dp"
    runs_forward = False  # the DataParallel runner calls training_step

    def __init__(self, precision: Optional[Precision] = None) -> None:
        super().__init__(precision=precision)
        self.parallel_devices: list[torch.device] = []

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        if not devices or devices[0].type != "cuda":
            found = "no CUDA GPU is available" if not torch.cuda.is_available() else "the accelerator resolved to the CPU"
            raise ConfigurationError(
                f"strategy='dp' splits each batch across several GPUs in one process, but {found}. Use "
                "strategy='ddp' instead: it is faster on GPUs, and on the CPU it runs devices=N processes (gloo)."
            )
        if num_nodes != 1:
            raise ConfigurationError(f"strategy='dp' runs on one machine; num_nodes={num_nodes}. Use strategy='ddp'.")
        super().connect(devices, num_nodes, precision)
        self.parallel_devices = list(devices)

    def setup_environment(self) -> None:
        torch.cuda.set_device(self.root_device)
        super().setup_environment()

    def setup_module(self, module: nn.Module) -> nn.Module:
        self.module = self.precision.convert_module(module).to(self.root_device)
        ids = [device.index for device in self.parallel_devices]
        self.model = nn.DataParallel(_TrainingStep(self.module), device_ids=ids, output_device=self.root_device.index)
        return self.model

    def compile_module(self, module: nn.Module, options: dict[str, Any]) -> None:
        """Not supported: DataParallel copies the module onto each GPU at every step, and the copies would share
        one compiled forward bound to the original."""
        raise ConfigurationError(
            "compile= is not supported with strategy='dp' (DataParallel re-replicates the module every step). Use "
            "strategy='ddp', which is also faster on several GPUs."
        )

    def training_step(self, *args: Any) -> Any:
        """``training_step`` on every GPU's slice of the batch; the per-slice losses are averaged."""
        with self.precision.forward_context():
            return average_replicas(self.model(*args), len(self.parallel_devices))

    def teardown(self) -> None:
        self.model = self.module
