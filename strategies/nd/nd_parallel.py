"""``strategy="nd_parallel"`` (``NDParallelStrategy``): data parallel (replicated and/or sharded), tensor parallel
and pipeline parallel composed on one ``DeviceMesh``, with ``torch.distributed`` doing every part.

    Trainer(devices=8, strategy=NDParallelStrategy(dp_shard="auto", tp=2))         # FSDP2 × TP
    Trainer(devices=8, strategy=NDParallelStrategy(dp_shard=2, tp=2, pp=2, microbatches=4))

What happens, in order (torchtitan's order):

1. ``configure_model()`` runs in the strategy's init context (the ``meta`` device: no memory). It builds the
   layers and, with ``tp > 1``, applies its tensor-parallel plan:
   ``parallelize_module(block, self.device_mesh["tp"], {"attn.q": ColwiseParallel(), ...})``. It may also call
   ``fully_shard(block, mesh=self.device_mesh["dp_shard"])`` itself.
2. With ``pp > 1`` the module is cut to this rank's pipeline stage (:mod:`trainer.strategies.nd.pipeline`).
3. Where ``configure_model`` did not shard, FSDP2 shards over the data-parallel dimensions: ``dp_shard`` alone,
   or HSDP over ``(dp_replicate, dp_shard)`` (replicated across ``dp_replicate``, sharded within ``dp_shard``).
   Units follow ``auto_wrap_policy``; a root unit takes whatever is left (and, without pipeline parallel, runs
   ``training_step`` inside its forward as ``FSDPStrategy`` does).
4. Only then do tensors get memory: each rank allocates and initialises its own shards
   (:func:`trainer.strategies.speed.deferred_init.materialize`); parts replicated across ranks are made equal.

Data: the ranks of one tensor-parallel group and of one pipeline see the same batch; the sampler splits the data
``dp_replicate × dp_shard`` ways. Checkpoints are sharded folders (or, ``state_dict_type="full"``, one file) keyed
by the whole model's parameter names, so they load at any other layout, or into one process.
"""
from __future__ import annotations

import datetime
import itertools
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.speed.deferred_init import has_meta_tensors, materialize
from trainer.strategies.launch.environments import ClusterEnvironment
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.data_parallel.fsdp import FSDPStrategy, _Root, wrap_targets
from trainer.strategies.nd.mesh import ROLES, MeshLayout, Size, build_device_mesh, check_size, check_sizes, resolve_layout
from trainer.strategies.nd.pipeline import SCHEDULES, PipelineRunner, forward_returns, keep_stage, split_batch
from trainer.strategies.precision import MixedPrecision, Precision
from trainer.strategies.checkpoint.sharded_checkpoint import is_dtensor, keyed_by_name, optimizer_state_by_name

_NATIVE_NAMES = {role: role for role in ROLES}


class NDParallelStrategy(FSDPStrategy):
    """Data, tensor and pipeline parallel on one device mesh.

    Args:
        dp_replicate: replicas of the (sharded) model, each holding all its shards; gradients are all-reduced
            across them (HSDP's outer dimension; DDP when ``dp_shard=1``).
        dp_shard: ranks the parameters, gradients and optimizer state are sharded over (FSDP2).
        tp: tensor-parallel ranks: each layer split across them by the plan ``configure_model`` applies.
        pp: pipeline stages: the layers split into consecutive stages, one per rank of a pipeline.
            One of the four may be ``-1`` or ``"auto"`` (the default for ``dp_shard``): it takes what the others
            leave of the world size. Their product must be the number of processes.
        microbatches: micro-batches each batch is cut into for the pipeline (default: ``pp``); more shrink the
            pipeline bubble (idle time ≈ (pp − 1) / (microbatches + pp − 1) of a step).
        pipeline_schedule: ``"1F1B"`` (default: one forward, one backward in the steady state; activations of at
            most ``pp`` micro-batches alive) or ``"GPipe"`` (all forwards, then all backwards).
        tp_plan: with ``tp > 1``, the tensor-parallel plan the strategy applies when ``configure_model`` did not
            apply one itself: ``"auto"`` (the default: the own plan of each Hugging Face model inside the module;
            one without a plan is an error saying what to give; other modules are left as ``configure_model``
            made them), a dict of module name or pattern to ``ParallelStyle`` (keys relative to the TrainModule,
            as ``parallelize_module`` takes them), or ``None`` (never).
        **fsdp_kwargs: as for :class:`~trainer.strategies.data_parallel.fsdp.FSDPStrategy` (``auto_wrap_policy``,
            ``reshard_after_forward``, ``mixed_precision``, ``state_dict_type``, ``sync_module_states``, ``timeout``,
            ``process_group_backend``, ``cluster_environment``, ``precision``, ...).
    """

    strategy_name = "nd_parallel"
    #: Gradients are complete after every backward (FSDP reduce-scatters each micro-batch; TP and PP peers need
    #: no averaging), so a checkpoint inside an accumulation window saves them as they are.
    reduces_every_backward = True

    def __init__(
        self,
        dp_replicate: Size = 1,
        dp_shard: Size = "auto",
        tp: Size = 1,
        pp: Size = 1,
        microbatches: Optional[int] = None,
        pipeline_schedule: str = "1F1B",
        tp_plan: Any = "auto",
        **fsdp_kwargs: Any,
    ) -> None:
        super().__init__(**fsdp_kwargs)
        if not (tp_plan is None or isinstance(tp_plan, dict) or (isinstance(tp_plan, str) and tp_plan == "auto")):
            raise ConfigurationError(
                f"tp_plan={tp_plan!r} is not understood. Use 'auto' (a Hugging Face model's own plan), a dict of "
                "module name or pattern -> ParallelStyle (keys relative to your TrainModule), or None (configure_model "
                "applies parallelize_module itself)."
            )
        self.tp_plan = tp_plan
        self._sizes: dict[str, Size] = dict(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, pp=pp)
        self._check_sizes()
        schedule = {s.lower(): s for s in SCHEDULES}.get(str(pipeline_schedule).lower())
        if schedule is None:
            raise ConfigurationError(
                f"pipeline_schedule={pipeline_schedule!r} is not supported. Use one of {list(SCHEDULES)}."
            )
        if microbatches is not None and (isinstance(microbatches, bool) or not isinstance(microbatches, int)
                                         or microbatches < 1):  # fmt: skip
            raise ConfigurationError(f"microbatches={microbatches!r} must be a positive int (or None for pp).")
        self.pipeline_schedule = schedule
        self._microbatches = microbatches
        #: The resolved sizes (after ``connect``).
        self.layout: Optional[MeshLayout] = None
        self._dim_names: dict[str, str] = dict(_NATIVE_NAMES)
        self._pipeline: Optional[PipelineRunner] = None
        self._prepared: Optional[nn.Module] = None
        self._all_names: list[str] = []  # the whole model's parameter names, in module order (pipeline parallel)
        self._other_stages: set[str] = set()

    # ------------------------------------------------------------------ layout
    def _check_sizes(self) -> None:
        check_sizes(**self._sizes)

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        super().connect(devices, num_nodes, precision)
        self.layout = self._resolve(len(devices), num_nodes)
        if self.layout.pp > 1:
            if isinstance(self.precision, MixedPrecision) and self.precision.name == "16-mixed":
                raise ConfigurationError(
                    "precision='16-mixed' scales the loss before backward, but under pipeline parallel the schedule "
                    "runs backward itself. Use precision='bf16-mixed' (no loss scaling needed)."
                )
            if self.state_dict_type == "full":
                raise ConfigurationError(
                    "state_dict_type='full' gathers the checkpoint on global rank 0, which holds one pipeline stage. "
                    "Use 'sharded' (the default) and `trainer checkpoint consolidate` for one file."
                )
        elif self._microbatches is not None:
            raise ConfigurationError(f"microbatches={self._microbatches} cuts batches for pipeline parallel; pp is 1.")

    def _resolve(self, devices_per_node: int, num_nodes: int) -> MeshLayout:
        return resolve_layout(devices_per_node * num_nodes, **self._sizes)

    @property
    def runs_forward(self) -> bool:  # type: ignore[override]
        """False under pipeline parallel: the schedule runs forward and backward, not a hand-written loop."""
        return self.layout is None or self.layout.pp == 1

    @property
    def microbatches(self) -> int:
        """Micro-batches per batch under pipeline parallel (``pp`` unless given)."""
        return self._microbatches or (self.layout.pp if self.layout else 1)

    @property
    def device_mesh(self) -> Any:
        """The N-D ``DeviceMesh`` (dims ``pp``, ``dp_replicate``, ``dp_shard``, ``tp``), created when first asked for
        once the process group exists (``configure_model`` and later)."""
        if self._mesh is None and self.layout is not None and dist.is_available() and dist.is_initialized():
            self._mesh = build_device_mesh(self.layout, self.root_device.type, self._dim_names)
        return self._mesh

    def _submesh(self, *roles: str) -> Any:
        names = tuple(self._dim_names[r] for r in roles)
        return self.device_mesh[names[0] if len(names) == 1 else names]

    def _group(self, role: str) -> Any:
        return self._submesh(role).get_group()

    def _dp_mesh(self) -> Any:
        layout = self.layout
        if layout.dp == 1:
            return None
        if layout.dp_replicate > 1:  # HSDP: replicated across dp_replicate, sharded within dp_shard
            return self._submesh("dp_replicate", "dp_shard")
        return self._submesh("dp_shard")

    @property
    def distributed_sampler_kwargs(self) -> Optional[dict[str, int]]:
        """Data is split over the data-parallel ranks only: TP and PP peers see the same batch."""
        if self.layout is None:
            return super().distributed_sampler_kwargs
        return {"num_replicas": self.layout.dp, "rank": self.layout.dp_rank(self.global_rank)}

    # ------------------------------------------------------------------ module
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Cut to this rank's pipeline stage, shard over the data-parallel dims, then materialise local shards."""
        if module is self._prepared:
            self.model = self._root if self._root is not None else module
            return self.model
        from torch.distributed.fsdp import FSDPModule, fully_shard

        layout = self.layout
        module = self.precision.convert_module(module)
        if layout.tp > 1:
            self._apply_tp_plan(module)
        deferred = has_meta_tensors(module)
        if self.sync_module_states and self.world_size > 1:  # (built on meta: its real parts)
            _broadcast_plain(module, self.root_device)  # TP's DTensors were scattered from one rank already
        if layout.pp > 1:
            from trainer.strategies.nd.hf_plan import refuse_pipelined_hf

            refuse_pipelined_hf(module)
            if not getattr(module, "automatic_optimization", True):
                raise ConfigurationError(
                    "Pipeline parallel runs forward and backward in its schedule: manual optimisation "
                    "(automatic_optimization = False) cannot drive it. Use automatic optimisation."
                )
            if isinstance(module, FSDPModule):
                raise ConfigurationError(
                    "configure_model called fully_shard on the whole module, but under pipeline parallel each rank "
                    "keeps one stage of it first. Shard only blocks (or nothing) and let the strategy shard the stage."
                )
            stage = layout.coordinates(self.global_rank)["pp"]
            self._all_names = keep_stage(module, stage, layout.pp)
            self._other_stages = set(self._all_names) - {name for name, _ in module.named_parameters()}
        root: Optional[_Root] = None
        dp_mesh = self._dp_mesh()
        if dp_mesh is not None:
            options = self._shard_options(dp_mesh)
            for target in wrap_targets(module, self.auto_wrap_policy):
                if not isinstance(target, FSDPModule):
                    fully_shard(target, **options)
            if layout.pp > 1:
                fully_shard(module, **options)  # the stage is the root unit: the schedule calls its forward
            else:
                root = _Root(module)
                fully_shard(root, **options)
        if deferred:
            materialize(module, self.root_device)
            self._sync_replicas(module)
        elif dp_mesh is None:
            module.to(self.root_device)
        if layout.pp > 1:
            group = self._group("pp")
            self._pipeline = PipelineRunner(module, group, self.root_device, self.microbatches, self.pipeline_schedule)
        self.module, self.model, self._root, self._prepared = module, (root or module), root, module
        self._steps = {}
        return self.model

    def _apply_tp_plan(self, module: nn.Module) -> None:
        """``tp_plan`` on a module ``configure_model`` left without tensor-parallel layers (no ``DTensor`` yet)."""
        if self.tp_plan is None or any(is_dtensor(p) for p in module.parameters()):
            return
        from torch.distributed.tensor.parallel import parallelize_module

        from trainer.strategies.hf_models import hf_models
        from trainer.strategies.nd.hf_plan import hf_tp_plan, retie, tied_slots
        from trainer.strategies.nd.tp_plan import resolve_tp_plan

        if isinstance(self.tp_plan, dict):
            plans = [self.tp_plan]
        else:
            plans = [hf_tp_plan(model, name) for name, model in hf_models(module)]
        ties = tied_slots(module)
        for plan in plans:
            resolve_tp_plan(module, plan)  # a key that matches nothing is an error, not parallelize_module's warning
            parallelize_module(module, self._submesh("tp"), plan)
        retie(ties)

    def _sync_replicas(self, module: nn.Module) -> None:
        """Make each tensor's local part equal across the data/tensor-parallel dims it is not sharded over."""
        roles = [r for r in ("dp_replicate", "dp_shard", "tp") if r in self._dim_names and self.layout.size(r) > 1]
        if not roles:
            return
        groups = {role: self._group(role) for role in roles}
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                sharded: set[str] = set()
                local = tensor
                if is_dtensor(tensor):
                    names = tensor.device_mesh.mesh_dim_names or ()
                    sharded = {name for name, placement in zip(names, tensor.placements) if not placement.is_replicate()}
                    local = tensor.to_local()
                for role in roles:
                    if self._dim_names[role] not in sharded:
                        group = groups[role]
                        dist.broadcast(local.data, src=dist.get_global_rank(group, 0), group=group)

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any) -> Any:
        """The pipeline's step (``pp > 1``), ``training_step`` inside the root FSDP unit, or plainly (TP only)."""
        if self._pipeline is not None:
            with self.precision.forward_context():
                return self._pipeline.train_step(args[0])
        if self._root is None:
            with self.precision.forward_context():
                return self.module.training_step(*args)
        return super().training_step(*args)

    def evaluation_step(self, step_name: str, *args: Any) -> Any:
        """Under pipeline parallel the model's output is computed through the stages and the step runs on every
        rank with ``self(inputs)`` returning it; otherwise as ``FSDPStrategy`` (or plainly)."""
        if self._pipeline is not None:
            batch = args[0]
            if step_name == "predict_step":
                inputs = batch if isinstance(batch, tuple) else (batch,)
            else:
                inputs, _ = split_batch(self.module, batch)
            with self.precision.forward_context():
                output = self._pipeline.forward(inputs)
                with forward_returns(self.module, output, inputs):
                    return getattr(self.module, step_name)(*args)
        if self._root is None:
            with self.precision.forward_context():
                return getattr(self.module, step_name)(*args)
        return super().evaluation_step(step_name, *args)

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Under pipeline parallel the schedule already ran backward: the loop's ``loss / accumulate`` only scales
        the batch's gradients (see :meth:`PipelineRunner.finish_backward`)."""
        if self._pipeline is not None:
            self._pipeline.finish_backward(loss)
            return
        super().backward(loss, *args, **kwargs)

    def backward_through(self, backward: Any, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """A module's own ``backward``, except under pipeline parallel, where the schedule already ran the backward."""
        if self._pipeline is not None:
            raise ConfigurationError(
                "The module overrides backward(), but with pipeline parallel the schedule runs the backward of "
                "every micro-batch itself: remove the override (use on_before_backward/on_after_backward instead)."
            )
        super().backward_through(backward, loss, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, before_step: Any, closure: Any = None, **kwargs: Any) -> bool:
        if self._pipeline is not None:
            self._pipeline.discard_unfinished()
        return super().optimizer_step(optimizer, before_step, closure, **kwargs)

    def clip_parameters(
        self, parameters: list[Tensor], clip_val: float, algorithm: str = "norm", norm_type: float = 2.0
    ) -> Optional[Tensor]:
        """Clip by the norm of the whole model's gradients: reduced over every mesh the shards live on and, with
        pipeline parallel, over the stages."""
        from trainer.strategies.nd.clipping import clip_grad_norm_over_mesh, clip_grad_value_over_mesh

        if algorithm != "norm":
            clip_grad_value_over_mesh(parameters, clip_val)
            return None
        group = self._group("pp") if self.layout.pp > 1 else None
        return clip_grad_norm_over_mesh(parameters, clip_val, norm_type, group)

    # ------------------------------------------------------------------ checkpoints
    def load_module_state_dict(
        self, state_dict: dict[str, Any], strict: bool = True, module: Optional[nn.Module] = None
    ) -> Any:
        """Shards or a full state dict; under pipeline parallel the other stages' entries are left out."""
        if self._other_stages:
            state_dict = {k: v for k, v in state_dict.items() if k not in self._other_stages}
        return super().load_module_state_dict(state_dict, strict, module)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """As ``FSDPStrategy``; under pipeline parallel each group lists the whole model's parameters (every stage
        writes the same), so the folder loads at any layout."""
        state = super().optimizer_state_dict(optimizer)
        if self._pipeline is not None:
            groups = self._model_groups(state["param_groups"])
            state = {**state, "param_groups": [{**g, "params": names} for g, names in zip(state["param_groups"], groups)]}
        return state

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Under pipeline parallel: keyed by name (an index-keyed full state is numbered over the whole model's
        groups), then only this stage's entries."""
        if self._pipeline is not None and state.get("state"):
            if not keyed_by_name(state):
                from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

                local = get_optimizer_state_dict(self.module, optimizer)["param_groups"]
                state = optimizer_state_by_name(state, [n for names in self._model_groups(local) for n in names])
            mine = {name for name, _ in self.module.named_parameters()}
            state = {
                "state": {name: value for name, value in state["state"].items() if name in mine},
                "param_groups": [{**g, "params": [n for n in g["params"] if n in mine]} for g in state["param_groups"]],
            }
        super().load_optimizer_state_dict(optimizer, state)

    def _model_groups(self, local_groups: list[dict[str, Any]]) -> list[list[str]]:
        """Each optimizer group's parameter names over every pipeline stage, in the whole model's order."""
        gathered: list[Any] = [None] * self.layout.pp
        dist.all_gather_object(gathered, [list(g["params"]) for g in local_groups], group=self._group("pp"))
        order = {name: i for i, name in enumerate(self._all_names)}
        if any(len(stage) != len(local_groups) for stage in gathered):
            raise ConfigurationError(
                "The pipeline stages' optimizers have different numbers of parameter groups; build the same groups "
                "on every stage (a group may be empty on some)."
            )
        return [sorted(set(itertools.chain(*(stage[i] for stage in gathered))), key=lambda n: order.get(n, len(order)))
                for i in range(len(local_groups))]  # fmt: skip

    def keep_untemplated(self, key: str) -> bool:
        """Entries of other pipeline stages are not read on this rank."""
        if self._other_stages:
            parts = key.split("/")
            position = {"state_dict": 1, "optimizer_states": 3, "accumulated_grads": 2}.get(parts[0])
            if position is not None and len(parts) > position and parts[position] in self._other_stages:
                return False
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.layout or self._sizes}, precision={self.precision.name!r})"


def _broadcast_plain(module: nn.Module, device: torch.device) -> None:
    """Global rank 0's values for every parameter and buffer that is not a DTensor (built eagerly on each rank)."""
    with torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            if not is_dtensor(tensor) and not tensor.is_meta:
                staged = tensor.detach().to(device)
                dist.broadcast(staged, src=0)
                if staged is not tensor:
                    tensor.copy_(staged)


class LightningModelParallelStrategy(NDParallelStrategy):
    """Lightning's ``ModelParallelStrategy(data_parallel_size, tensor_parallel_size, ...)``: a 2-D mesh with dims
    ``"data_parallel"`` (FSDP2) and ``"tensor_parallel"``. Built by ``ModelParallelStrategy(...)`` when given these
    arguments. ``"auto"``: data parallel over the nodes, tensor parallel over each node's devices."""

    strategy_name = "model_parallel"

    def __init__(
        self,
        data_parallel_size: Size = "auto",
        tensor_parallel_size: Size = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: Optional[str] = None,
        timeout: Union[None, float, datetime.timedelta] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        precision: Optional[Precision] = None,
    ) -> None:
        super().__init__(dp_shard=data_parallel_size, tp=tensor_parallel_size,
                         state_dict_type="sharded" if save_distributed_checkpoint else "full",
                         process_group_backend=process_group_backend, timeout=timeout,
                         cluster_environment=cluster_environment, precision=precision)  # fmt: skip
        self._dim_names = {"dp_shard": "data_parallel", "tp": "tensor_parallel"}

    def _check_sizes(self) -> None:
        sizes = {"data_parallel_size": self._sizes["dp_shard"], "tensor_parallel_size": self._sizes["tp"]}
        for name, value in sizes.items():
            check_size(name, value)

    def _resolve(self, devices_per_node: int, num_nodes: int) -> MeshLayout:
        sizes = dict(self._sizes)
        if sizes["dp_shard"] in ("auto", -1) and sizes["tp"] in ("auto", -1):
            sizes.update(dp_shard=num_nodes, tp=devices_per_node)
        try:
            return resolve_layout(devices_per_node * num_nodes, **sizes)
        except ConfigurationError as err:  # say it in the names the user gave
            message = str(err).replace("dp_shard", "data_parallel_size").replace("tp=", "tensor_parallel_size=")
            raise ConfigurationError(message) from None
