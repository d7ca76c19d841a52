"""``strategy="fsdp"`` (``FSDPStrategy``): parameters, gradients and optimizer state sharded across ranks with FSDP2
(``torch.distributed.fsdp.fully_shard``), ZeRO-3-like. ``"zero2"`` is the same with ``reshard_after_forward=False``.

How it runs. Each rank holds a 1/world slice (dim 0) of every parameter as a ``DTensor``; the optimizer is
built on those slices (the Trainer calls ``configure_optimizers`` after ``setup_module``), so its state is
sharded too. Modules chosen by ``auto_wrap_policy`` become FSDP units: a unit's parameters are all-gathered
just before its forward and freed after it (``reshard_after_forward=True``), gathered again for its backward,
and its gradients are reduce-scattered (averaged) straight into the slices. The user's module sits inside a
root unit whose forward is redirected to ``training_step`` / the evaluation steps, so the root's hooks run
around the step exactly as FSDP expects around a forward, whichever submodules the step calls.

Gradient accumulation reduce-scatters every micro-batch into the sharded gradients (the sum is the same),
instead of holding unsharded gradients until the window ends: keeping memory sharded is the point here.

Mixed precision follows the precision plugin: "bf16-mixed"/"16-mixed" all-gather parameters in that dtype and
reduce gradients in float32 (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``), with the plugin's
autocast around the step; "-true" precisions convert the module before sharding.

Checkpoints are sharded folders by default (``state_dict_type="sharded"``, see
:mod:`trainer.strategies.checkpoint.sharded_checkpoint`); ``"full"`` gathers one file on global rank 0.
"""
from __future__ import annotations

import datetime
import itertools
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.hf_models import no_split_classes
from trainer.strategies.speed.deferred_init import materialize
from trainer.strategies.launch.environments import ClusterEnvironment
from trainer.strategies.launch.hang_report import DEFAULT_TRAIN_TIMEOUT_S
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.parallel import ParallelStrategy
from trainer.strategies.precision import HalfPrecision, MixedPrecision, Precision
from trainer.strategies.data_parallel.redirection import ForwardRedirection
from trainer.strategies.checkpoint.sharded_checkpoint import (
    ShardedCheckpointIO,
    check_state_dict_type,
    is_dtensor,
    keyed_by_name,
    optimizer_state_by_index,
    optimizer_state_by_name,
    parameter_names,
)

WrapPolicy = Union[None, str, int, Iterable[type], Callable[[nn.Module], bool]]


class _Root(nn.Module):
    """The outermost FSDP unit around the user's module; its forward runs whatever the module's forward is
    pointed at (``training_step`` during a redirected step)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def wrap_targets(module: nn.Module, policy: WrapPolicy) -> list[nn.Module]:
    """The submodules ``policy`` makes FSDP units, children before parents (the order ``fully_shard`` needs).

    ``policy``: ``None`` (no units below the root), module classes (every instance), an int (a module whose
    parameters not already in a unit below it number at least this many), ``callable(module) -> bool``, or
    ``"auto"``: the blocks a Hugging Face model names in its ``_no_split_modules``, none for other modules.
    """
    policy = check_wrap_policy(policy)
    if isinstance(policy, str):  # "auto"
        policy = no_split_classes(module) or None
    if policy is None:
        return []
    targets: list[nn.Module] = []
    seen: set[int] = set()

    def visit(node: nn.Module) -> int:
        remaining = sum(p.numel() for p in node.parameters(recurse=False))
        for child in node.children():
            if id(child) not in seen:
                seen.add(id(child))
                remaining += visit(child)
        if node is not module and remaining and _selected(node, remaining, policy):
            targets.append(node)
            return 0
        return remaining

    visit(module)
    return targets


def _selected(node: nn.Module, remaining: int, policy: WrapPolicy) -> bool:
    if isinstance(policy, int):
        return remaining >= policy
    if isinstance(policy, tuple):
        return isinstance(node, policy)
    return bool(policy(node))


def check_wrap_policy(policy: Any) -> WrapPolicy:
    """Normalise ``auto_wrap_policy`` (a set of classes becomes a tuple) or raise saying what is accepted."""
    if policy is None or (isinstance(policy, str) and policy == "auto") or (isinstance(policy, int) and not isinstance(policy, bool) and policy > 0):
        return policy
    if isinstance(policy, type) and issubclass(policy, nn.Module):
        return (policy,)
    if isinstance(policy, (set, frozenset, list, tuple)) and policy and all(
        isinstance(c, type) and issubclass(c, nn.Module) for c in policy
    ):
        return tuple(policy)
    if callable(policy) and not isinstance(policy, type):
        return policy
    raise ConfigurationError(
        f"auto_wrap_policy={policy!r} is not understood. Use a set of module classes (e.g. {{TransformerBlock}}), "
        "a positive int (minimum parameters per unit), a function module -> bool, 'auto' (a Hugging Face model's "
        "_no_split_modules) or None (the root only)."
    )


class FSDPStrategy(ShardedCheckpointIO, ParallelStrategy):
    """Fully sharded data parallel training with FSDP2 (``fully_shard``).

    Args:
        auto_wrap_policy: which submodules become FSDP units (gathered one at a time): ``"auto"`` (the default:
            the blocks a Hugging Face model names in its ``_no_split_modules``; for other modules the root only), a
            set of module classes (e.g. ``{TransformerBlock}``), a minimum parameter count, a function
            ``module -> bool``, or ``None`` (one unit for the whole module: the whole model is gathered at once).
        cpu_offload: keep the sharded parameters, gradients and optimizer state in CPU memory (CUDA only); the
            optimizer step then runs on the CPU.
        reshard_after_forward: free gathered parameters after each unit's forward (``True``, ZeRO-3) or keep them
            until its backward (``False``, ZeRO-2: less communication, more memory).
        mixed_precision: a ``torch.distributed.fsdp.MixedPrecisionPolicy`` to use instead of the one derived from
            the Trainer's ``precision``; its ``param_dtype`` must agree with that precision.
        state_dict_type: ``"sharded"`` (checkpoints are folders, each rank writes its shards) or ``"full"``
            (one file gathered on global rank 0).
        sync_module_states: broadcast global rank 0's initial parameters and buffers before sharding, so every
            rank starts from the same model (as DDP does) even if they were initialised differently.
        timeout / train_timeout / process_group_backend / cluster_environment: as for ``DDPStrategy``.
    """

    strategy_name = "fsdp"
    is_sharded = True

    def __init__(
        self,
        auto_wrap_policy: WrapPolicy = "auto",
        cpu_offload: bool = False,
        reshard_after_forward: bool = True,
        mixed_precision: Any = None,
        state_dict_type: str = "sharded",
        sync_module_states: bool = True,
        timeout: Union[None, float, datetime.timedelta] = None,
        process_group_backend: Optional[str] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        precision: Optional[Precision] = None,
        train_timeout: Union[None, float, datetime.timedelta] = DEFAULT_TRAIN_TIMEOUT_S,
    ) -> None:
        super().__init__(cluster_environment, process_group_backend, timeout, "popen", precision, train_timeout)
        self.auto_wrap_policy = check_wrap_policy(auto_wrap_policy)
        self.cpu_offload = bool(cpu_offload)
        self.reshard_after_forward = bool(reshard_after_forward)
        self.mixed_precision = mixed_precision
        self.state_dict_type = check_state_dict_type(state_dict_type)
        self.sync_module_states = bool(sync_module_states)
        self._root: Optional[_Root] = None
        self._mesh: Any = None
        self._units: list[nn.Module] = []  # the FSDP units below the root, children first
        self._steps: dict[str, ForwardRedirection] = {}
        self._optimizers: list[Optimizer] = []

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        super().connect(devices, num_nodes, precision)
        self._mp_policy()  # a mixed_precision contradicting precision fails here, before any process starts
        if self.cpu_offload and devices and devices[0].type != "cuda":
            raise ConfigurationError(
                f"{type(self).__name__}(cpu_offload=True) keeps the shards in CPU memory while GPUs compute, but the "
                "devices resolved to the CPU, where everything already is. Drop cpu_offload, or use accelerator='gpu'."
            )

    # ------------------------------------------------------------------ module and optimizers
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Convert for the precision, make rank 0's weights everyone's, shard the policy's units and the root."""
        if self._root is not None and self._root.module is module:
            self.model = self._root  # a later stage (e.g. validate after fit): the module is already sharded
            return self.model
        from torch.distributed.fsdp import FSDPModule, fully_shard

        module = self.precision.convert_module(module)
        if self.sync_module_states and self.world_size > 1:  # (a module built on meta: its real parts)
            _broadcast_states(module, self.root_device)
        options = self._shard_options(self.device_mesh)
        self._units = wrap_targets(module, self.auto_wrap_policy)
        for target in self._units:
            if not isinstance(target, FSDPModule):  # configure_model may have sharded it already
                fully_shard(target, **options)
        root = _Root(module)
        fully_shard(root, **options)
        if materialize(module, self.root_device) and self.world_size > 1:
            _broadcast_states(module, self.root_device, buffers_only=True)  # FSDP shards parameters, not buffers
        self.module, self.model, self._root = module, root, root
        self._steps = {}
        return root

    def compile_module(self, module: nn.Module, options: dict[str, Any]) -> None:
        """Compile each FSDP unit's forward on its own (as torchtitan does), FSDP's hooks eager around them; without
        units below the root, the module's forward."""
        from trainer.strategies.speed.compile import compile_forward

        for unit in self._units or [module]:
            compile_forward(unit, options)

    @property
    def device_mesh(self) -> Any:
        """A 1-D ``DeviceMesh`` over every rank (dim ``"dp_shard"``), created when first asked for (after the
        process group exists: in ``configure_model`` and later)."""
        if self._mesh is None and dist.is_available() and dist.is_initialized():
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.root_device.type, (self.world_size,), mesh_dim_names=("dp_shard",))
        return self._mesh

    def module_init_context(self, empty_init: Optional[bool] = None) -> Any:
        """Modules are built on the ``meta`` device (no memory) unless ``empty_init=False``; ``setup_module``
        shards them and each rank materialises and initialises only its shards."""
        from trainer.strategies.speed.deferred_init import module_init_context

        return module_init_context(self._init_device(), self.precision, empty_init, meta=empty_init is not False)

    def _shard_options(self, mesh: Any) -> dict[str, Any]:
        return dict(mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=self._mp_policy(),
                    offload_policy=self._offload_policy())  # fmt: skip

    def _mp_policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        plugin = self.precision
        compute = plugin.dtype if isinstance(plugin, (MixedPrecision, HalfPrecision)) else None
        if self.mixed_precision is not None:
            given = getattr(self.mixed_precision, "param_dtype", None)
            if given is not None and given != compute:
                raise ConfigurationError(
                    f"mixed_precision has param_dtype={given} but precision={plugin.name!r} computes in "
                    f"{compute or 'the parameters’ own dtype'}. Make them agree (e.g. precision='bf16-mixed' for "
                    "param_dtype=torch.bfloat16), or drop mixed_precision to derive it from precision."
                )
            return self.mixed_precision
        if isinstance(plugin, MixedPrecision):
            return MixedPrecisionPolicy(param_dtype=plugin.dtype, reduce_dtype=torch.float32)
        return MixedPrecisionPolicy()

    def _offload_policy(self) -> Any:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        return CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        """Check the optimizers hold the sharded parameters (they must be built after ``setup_module``)."""
        sharded = {id(p) for p in self.module.parameters()}
        for optimizer in optimizers:
            if any(id(p) not in sharded for group in optimizer.param_groups for p in group["params"]):
                raise ConfigurationError(
                    f"A {type(optimizer).__name__} holds parameters that are not the sharded module's. With "
                    f"strategy={self.strategy_name!r}, build the optimizer in configure_optimizers() from "
                    "self.parameters() (it runs after the module is sharded), not before."
                )
        self._optimizers = list(optimizers)
        return super().setup_optimizers(optimizers)

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any) -> Any:
        """``module.training_step`` run inside the root unit's forward (its FSDP hooks run around the step)."""
        with self.precision.forward_context():
            return self._redirect("training_step")(*args)

    def evaluation_step(self, step_name: str, *args: Any) -> Any:
        """Evaluation steps also go through the root unit: its parameters are sharded outside its forward."""
        with self.precision.forward_context():
            return self._redirect(step_name)(*args)

    def _redirect(self, step_name: str) -> ForwardRedirection:
        run = self._steps.get(step_name)
        if run is None:
            run = self._steps[step_name] = ForwardRedirection(self._root, self.module, step_name)
        return run

    def clip_parameters(
        self, parameters: list[Tensor], clip_val: float, algorithm: str = "norm", norm_type: float = 2.0
    ) -> Optional[Tensor]:
        """Clip sharded gradients: the total norm is computed across every rank's shards."""
        norm = super().clip_parameters(parameters, clip_val, algorithm, norm_type)
        return norm.full_tensor() if is_dtensor(norm) else norm

    # ------------------------------------------------------------------ state dicts
    def module_state_dict(self, module: Optional[nn.Module] = None) -> dict[str, Any]:
        """This rank's shards (``state_dict_type="sharded"``), or the full state dict on global rank 0 (``"full"``;
        other ranks get ``{}``)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        target = self.module if module is None else module
        return get_model_state_dict(target, options=self._options(full=self.state_dict_type == "full"))

    def load_module_state_dict(
        self, state_dict: dict[str, Any], strict: bool = True, module: Optional[nn.Module] = None
    ) -> Any:
        """Load shards (DTensor values) or a full state dict (every rank holds it; each keeps its slice)."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        target = self.module if module is None else module
        sharded = any(is_dtensor(v) for v in state_dict.values())
        return set_model_state_dict(target, state_dict, options=self._options(full=not sharded, strict=strict))

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """Sharded and keyed by parameter name, or (``"full"``) torch's index-keyed format on global rank 0."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full = self.state_dict_type == "full"
        state = get_optimizer_state_dict(self.module, optimizer, options=self._options(full=full))
        return optimizer_state_by_index(state) if full else state

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a sharded (name-keyed, DTensor) or full (index- or name-keyed) optimizer state."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        if not state.get("state"):
            # Nothing per parameter (plain SGD): only the groups' settings to restore. torch's loader needs a
            # state tensor to find the device and fails without one.
            for group, saved in zip(optimizer.param_groups, state["param_groups"]):
                group.update({key: value for key, value in saved.items() if key != "params"})
            return
        if not keyed_by_name(state):
            state = optimizer_state_by_name(state, parameter_names(self.module, optimizer))
        sharded = any(is_dtensor(v) for entry in state.get("state", {}).values() for v in entry.values())
        set_optimizer_state_dict(self.module, optimizer, state, options=self._options(full=not sharded))

    @staticmethod
    def _options(full: bool, strict: bool = True) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=full, cpu_offload=full, strict=strict)

    def checkpoint_templates(self, sections: dict[str, Any]) -> dict[str, Any]:
        """Where a sharded checkpoint's tensors load to: this rank's parameter, optimizer and gradient shards."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        templates: dict[str, Any] = {"state_dict": get_model_state_dict(self.module)}
        if self._optimizers and "optimizer_states" in sections:
            templates["optimizer_states"] = [get_optimizer_state_dict(self.module, opt) for opt in self._optimizers]
        if "accumulated_grads" in sections:
            params = self.module.named_parameters()
            templates["accumulated_grads"] = {"grads": {n: torch.zeros_like(p) for n, p in params if p.requires_grad}}
        return templates

    def load_checkpoint(self, path: Any) -> dict[str, Any]:
        """A sharded folder (each rank reads its shards) or a full file; gradients of an unfinished accumulation
        window become this rank's shards of their cross-rank average (what FSDP would have reduced)."""
        checkpoint = super().load_checkpoint(path)
        saved = checkpoint.get("accumulated_grads")
        if saved and not all(is_dtensor(g) for g in saved.get("grads", {}).values()):
            checkpoint["accumulated_grads"] = self._shard_gradients(saved)
        return checkpoint

    def _shard_gradients(self, saved: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed.tensor import distribute_tensor

        params = dict(self.module.named_parameters())
        gathered = not saved.get("reduced") and saved.get("world_size", 1) > 1  # one row per saving rank
        grads = {}
        for name, grad in saved["grads"].items():
            param = params.get(name)
            if param is None or is_dtensor(grad):  # another pipeline stage's; already this rank's shard
                if param is not None:
                    grads[name] = grad
                continue
            full = (grad.mean(0) if gathered else grad).to(param.device, param.dtype)
            grads[name] = distribute_tensor(full, param.device_mesh, param.placements) if is_dtensor(param) else full
        return {**saved, "grads": grads, "reduced": True}

    def teardown(self) -> None:
        self._optimizers = []
        super().teardown()


def _broadcast_states(module: nn.Module, device: torch.device, buffers_only: bool = False) -> None:
    """Give every rank global rank 0's parameters and buffers (one tensor at a time, through ``device``); tensors
    still on ``meta`` are initialised on every rank alike later (deferred initialisation)."""
    with torch.no_grad():
        for tensor in itertools.chain(() if buffers_only else module.parameters(), module.buffers()):
            if tensor.is_meta:
                continue
            staged = tensor.detach().to(device)
            dist.broadcast(staged, src=0)
            if staged is not tensor:
                tensor.copy_(staged)
