"""``strategy="model_parallel"`` (``ModelParallelStrategy``): one process places the module's layers on several
devices, for a model whose parameters, gradients and optimizer state do not fit on one device.

The layers run one device after another (no overlap: while device 1 works, device 0 waits), so this buys
memory, not speed. Activations cross devices through forward pre-hooks: each placed submodule moves its
inputs to its own device; the whole module's output is moved back to the first device (where batches and
``training_step``'s targets are). Autograd carries gradients back across the same copies, and the optimizer
steps every parameter on the device it lives on.

``device_map="auto"`` balances parameter and buffer bytes across the devices under ``max_memory``
(:func:`trainer.strategies.nd.device_map.plan_device_map`); an explicit ``{submodule name: device}`` is also accepted,
e.g. ``{"encoder": 0, "decoder": 1}`` for a sequence-to-sequence model (ints index the Trainer's devices).

Within a module whose children are on different devices, its own code sees each child's output on that
child's device: combine them with its own parameters only after ``.to(...)``, or keep such a module whole
(``no_split_module_classes``). In ``training_step``, call ``self(...)`` (the output comes back to
``self.device``) rather than chaining submodules on different devices by hand.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from trainer.strategies.checkpoint.whole_folder import WholeFolderLoading
from trainer.strategies.nd.device_map import Budget, plan_device_map, resolve_device_map, tensor_devices
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision import Precision
from trainer.strategies.strategy import Strategy, move_to_device


_MESH_ARGUMENTS = ("data_parallel_size", "tensor_parallel_size", "save_distributed_checkpoint", "process_group_backend",
                   "timeout", "cluster_environment")  # fmt: skip
_DEVICE_MAP_ARGUMENTS = ("device_map", "max_memory", "no_split_module_classes")


class _EitherForm(type):
    """``isinstance(s, ModelParallelStrategy)`` also holds for the Lightning (device-mesh) form it builds."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        mesh_form = sys.modules.get("trainer.strategies.nd.nd_parallel")
        return cls is ModelParallelStrategy and mesh_form is not None and isinstance(
            obj, mesh_form.LightningModelParallelStrategy)  # fmt: skip


class ModelParallelStrategy(WholeFolderLoading, Strategy, metaclass=_EitherForm):
    """Split one module across the devices of this process, or (Lightning's form) across processes on a 2-D mesh.

    Two forms, one name:

    - ``ModelParallelStrategy(device_map=..., max_memory=..., no_split_module_classes=...)`` and
      ``strategy="model_parallel"``: one process, the layers placed on its several devices (this class).
    - ``ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size="auto", save_distributed_checkpoint=True,
      process_group_backend=None, timeout=...)`` as in Lightning: one process per device on a 2-D ``DeviceMesh``
      with dims ``"data_parallel"`` and ``"tensor_parallel"``; ``configure_model`` applies the TP plan and may call
      ``fully_shard``. It builds a :class:`trainer.strategies.nd.nd_parallel.LightningModelParallelStrategy`.

    Args:
        device_map: ``"auto"`` or ``{submodule name: device}`` (a device, ``"cuda:1"``, or an index into the
            Trainer's devices); ``""`` names the whole module (everything not named otherwise).
        max_memory: parameter and buffer bytes allowed per device for ``"auto"``: an int or ``"20GB"`` for every
            device, or a list with one entry per device (``None`` for no limit). Default: no limit, even split.
        no_split_module_classes: module classes ``"auto"`` must keep whole on one device (e.g. a block with a
            residual connection that adds its input to its output).
    """

    strategy_name = "model_parallel"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        lightning = [name for name in _MESH_ARGUMENTS if name in kwargs]
        if cls is ModelParallelStrategy and (lightning or (args and isinstance(args[0], int))):
            mixed = [name for name in _DEVICE_MAP_ARGUMENTS if name in kwargs]
            if mixed or (args and not isinstance(args[0], int)):
                raise ConfigurationError(
                    f"ModelParallelStrategy got {lightning} (the device-mesh form: one process per device) and "
                    f"{mixed or 'a device map'} (the device-map form: one process, several devices). Use one form."
                )
            from trainer.strategies.nd.nd_parallel import LightningModelParallelStrategy

            return LightningModelParallelStrategy(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        device_map: Union[str, dict[str, Any]] = "auto",
        max_memory: Budget = None,
        no_split_module_classes: Sequence[type] = (),
        precision: Optional[Precision] = None,
    ) -> None:
        super().__init__(precision=precision)
        if device_map != "auto" and not isinstance(device_map, dict):
            raise ConfigurationError(
                f"device_map={device_map!r} must be 'auto' or a dict {{submodule name: device}}, e.g. "
                "{'encoder': 0, 'decoder': 1}."
            )
        self.device_map_setting = device_map
        self.max_memory = max_memory
        self.no_split = tuple(no_split_module_classes)
        self.parallel_devices: list[torch.device] = [self._root_device]
        #: After ``setup_module``: ``{submodule name: index into parallel_devices}`` (the plan in effect).
        self.device_map: dict[str, int] = {}
        self._handles: list[Any] = []

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        if num_nodes != 1:
            raise ConfigurationError(
                f"strategy='model_parallel' splits a module across the devices of one process; num_nodes={num_nodes}. "
                "Use strategy='fsdp' to shard across machines."
            )
        if devices and devices[0].type == "mps":
            raise ConfigurationError("strategy='model_parallel' needs several devices; MPS offers one. Use devices=1.")
        super().connect(devices, num_nodes, precision)
        self.parallel_devices = list(devices)

    def setup_environment(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        super().setup_environment()

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Convert for the precision, place each part on its device and hook the device changes."""
        for handle in self._handles:
            handle.remove()
        module = self.precision.convert_module(module)
        devices = self.parallel_devices
        if self.device_map_setting == "auto":
            device_map = plan_device_map(module, list(range(len(devices))), self.max_memory, self.no_split)
        else:
            device_map = resolve_device_map(module, self.device_map_setting, devices)
        placement = {name: devices[index] for name, index in tensor_devices(module, device_map).items()}
        with torch.no_grad():
            for prefix, owner in module.named_modules():
                for name, param in owner.named_parameters(recurse=False):
                    param.data = param.data.to(placement[_join(prefix, name)])
                for name, buffer in owner.named_buffers(recurse=False):
                    owner._buffers[name] = buffer.to(placement[_join(prefix, name)])
        self._handles = [module.get_submodule(name).register_forward_pre_hook(_MoveInputs(devices[index]),
                                                                              with_kwargs=True)
                         for name, index in device_map.items()]  # fmt: skip
        self._handles.append(module.register_forward_hook(_MoveOutput(self.root_device)))
        self.device_map = device_map
        self.module = self.model = module
        return module

    def teardown(self) -> None:
        """The module stays placed and hooked (it may be evaluated next); ``setup_module`` re-places it."""


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class _MoveInputs:
    """Forward pre-hook: the module's tensor arguments move to its device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return move_to_device(args, self.device), move_to_device(kwargs, self.device)


class _MoveOutput:
    """Forward hook on the whole module: its output comes back to the first device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> Any:
        return move_to_device(output, self.device)
