"""Pipeline parallel across ranks with ``torch.distributed.pipelining``: the module split into stages, one per
pipeline rank, each batch cut into micro-batches that flow through the stages (GPipe or 1F1B schedule).

How a module is split (torchtitan's way: no tracing, the module's own code runs on every stage):

- Its **units** are the root's children in registration order, with a container (``nn.ModuleList``,
  ``nn.ModuleDict``, ``nn.Sequential``, also nested) expanded into its entries:
  ``embed, layers.0, ..., layers.11, norm, head``. A module the split goes into is expanded too:
  with ``self.model = Transformer(...)`` the units are ``model.embed, model.layers.0, ..., model.head`` when a
  split point names ``model.layers.6``, or when the planner cannot balance whole units. Buffers held by the root
  or by an expanded module (a RoPE table every block reads) stay on every stage; parameters there are refused.
- **Stage boundaries**: ``module.pipeline_split_points`` (a list, or a method ``(num_stages) -> list``) names the
  unit each later stage starts at, e.g. ``["layers.6"]`` for two stages; without it, the device-map planner
  (:func:`trainer.strategies.nd.device_map.plan_device_map`) assigns whole units to stages by parameter bytes.
- Each rank keeps only its stage: the other units are removed (a container loses the entries, keeping the
  others' names, so state-dict keys stay those of the whole model; a direct child becomes ``None``). The
  module's ``forward`` must therefore skip what is missing and accept the previous stage's output as its input,
  e.g. ``h = self.embed(tokens) if self.embed is not None else tokens``; ``for layer in self.layers.values(): ...``;
  ``return self.head(h) if self.head is not None else h``.

Training: a batch is ``(inputs, target)`` (or what ``module.pipeline_inputs(batch)`` returns), and the last
stage computes ``module.pipeline_loss(output, target)`` per micro-batch: the schedule runs forward and backward
itself, so ``training_step`` is not called. The step's loss (mean over micro-batches) is sent from the last stage
to every rank of the pipeline and returned in its place (``outputs["loss"]`` in ``on_train_batch_end``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.strategies.errors import ConfigurationError

SCHEDULES = ("GPipe", "1F1B")
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def pipeline_units(module: nn.Module, expand: Iterable[str] = ()) -> list[tuple[str, nn.Module, str]]:
    """``(name, owner, key)`` of each unit in order: ``owner._modules[key]`` is the unit called ``name``.

    Containers are expanded into their entries; so is every module named in ``expand`` or holding one of them
    (``expand=["model"]``: the units of ``self.model = Transformer(...)`` are ``model.embed, model.layers.0, ...``).
    """
    expand = set(expand)
    units: list[tuple[str, nn.Module, str]] = []

    def visit(owner: nn.Module, prefix: str) -> None:
        for key, child in list(owner._modules.items()):
            if child is None:
                continue
            name = f"{prefix}{key}"
            if isinstance(child, _CONTAINERS):  # nested containers too (nanoGPT's transformer.h.0, ...)
                visit(child, f"{name}.")
            elif name in expand or any(e.startswith(f"{name}.") for e in expand):
                params = [n for n, _ in child.named_parameters(recurse=False)]
                if params:
                    raise ConfigurationError(
                        f"Pipeline parallel splits inside '{name}', but '{name}' holds parameters {params} directly, "
                        "which no one stage would own. Move them into a submodule (e.g. the embedding or the head)."
                    )
                visit(child, f"{name}.")  # its buffers stay on every stage (e.g. a RoPE table)
            else:
                units.append((name, owner, key))

    visit(module, "")
    return units


def _container_holders(units: list[tuple[str, nn.Module, str]]) -> list[str]:
    """Units that hold a container directly (a model wrapping its blocks), to expand when whole units cannot
    make the stages."""
    return [name for name, owner, key in units
            if any(isinstance(c, _CONTAINERS) for c in owner._modules[key].children())]  # fmt: skip


def assign_stages(module: nn.Module, num_stages: int) -> list[int]:
    """The stage of each unit of :func:`split_units` (the units as :func:`split_units` chooses them)."""
    return split_units(module, num_stages)[1]


def split_units(module: nn.Module, num_stages: int) -> tuple[list[tuple[str, nn.Module, str]], list[int]]:
    """The units (see :func:`pipeline_units`) and the stage of each, from the module's split points or the
    planner. Split points may name nested modules (``"model.layers.4"``); without them, a unit wrapping a container
    (``self.model = Transformer(...)``) is split inside when whole units cannot make the stages."""
    params = [name for name, _ in module.named_parameters(recurse=False)]
    if params:
        raise ConfigurationError(
            f"{type(module).__name__} holds parameters {params} directly; under pipeline parallel every parameter "
            "must belong to a submodule that one stage owns. Move them into a submodule (e.g. the head). (Buffers "
            "held directly, such as a RoPE table, are kept on every stage.)"
        )
    points = getattr(module, "pipeline_split_points", None)
    if callable(points):
        points = points(num_stages)
    if points is not None:
        points = list(points)
        units = pipeline_units(module, [p.rpartition(".")[0] for p in points if "." in p])
        names = [name for name, _, _ in units]
        if len(points) != num_stages - 1 or any(p not in names for p in points):
            raise ConfigurationError(
                f"pipeline_split_points={points} must name {num_stages - 1} unit(s) where stages 1..{num_stages - 1} "
                f"begin, in order; the units are {names}."
            )
        starts = [names.index(p) for p in points]
        if starts != sorted(starts) or len(set(starts)) != len(starts) or starts[0] == 0:
            raise ConfigurationError(f"pipeline_split_points={points} must be increasing and not the first unit.")
        return units, [sum(index >= start for start in starts) for index in range(len(names))]
    expand: list[str] = []
    while True:
        units = pipeline_units(module, expand)
        try:
            return units, _planned_stages(module, units, num_stages)
        except ConfigurationError:
            more = [name for name in _container_holders(units) if name not in expand]
            if not more:
                raise
            expand += more


def _planned_stages(module: nn.Module, units: list[tuple[str, nn.Module, str]], num_stages: int) -> list[int]:
    # The memory planner's split (trainer.strategies.nd.pipeline_stages), so `trainer estimate-memory` predicts this one.
    from trainer.strategies.nd.pipeline_stages import auto_boundaries, module_stages

    unit_types = tuple({type(owner._modules[key]) for _, owner, key in units})
    try:
        boundaries = auto_boundaries(module, num_stages, no_split=unit_types)
        of_module = module_stages(module, boundaries)
        stages = [of_module[name] for name, _, _ in units]
    except ConfigurationError:
        stages = []
    if sorted(set(stages)) != list(range(num_stages)) or stages != sorted(stages):
        raise ConfigurationError(
            f"The planner could not give each of the {num_stages} pipeline stages whole units of "
            f"{[name for name, _, _ in units]}. Use fewer stages, or set pipeline_split_points on the module "
            "(nested names such as 'model.layers.4' are accepted)."
        )
    return stages


def keep_stage(module: nn.Module, stage: int, num_stages: int) -> list[str]:
    """Remove every unit not in ``stage``; returns the parameter names of the whole model, in module order."""
    all_names = [name for name, _ in module.named_parameters()]
    units, stages = split_units(module, num_stages)
    owner_of: dict[int, int] = {}
    for (name, owner, key), unit_stage in zip(units, stages):
        for tensor in owner._modules[key].parameters():
            if owner_of.setdefault(id(tensor), unit_stage) != unit_stage:
                raise ConfigurationError(
                    f"A parameter of '{name}' is shared with a unit of another pipeline stage (tied weights, e.g. an "
                    "embedding and the output layer). Untie them, or choose split points that keep both in one stage."
                )
    for (name, owner, key), unit_stage in zip(units, stages):
        if unit_stage == stage:
            continue
        if isinstance(owner, _CONTAINERS):
            del owner._modules[key]  # keeps the other entries' keys (ModuleList.__delitem__ would renumber them)
        else:
            setattr(owner, key, None)
    return all_names


def split_batch(module: nn.Module, batch: Any) -> tuple[tuple[Any, ...], Any]:
    """``(inputs, target)`` of a training or evaluation batch under pipeline parallel."""
    custom = getattr(module, "pipeline_inputs", None)
    if callable(custom):
        inputs, target = custom(batch)
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        inputs, target = batch
    else:
        raise ConfigurationError(
            f"Under pipeline parallel a batch must be (inputs, target); got {type(batch).__name__}. Define "
            f"{type(module).__name__}.pipeline_inputs(batch) returning (inputs, target) for other batch types."
        )
    return (inputs if isinstance(inputs, tuple) else (inputs,)), target


class PipelineRunner:
    """This rank's stage and schedule; runs a training step or an evaluation forward through the pipeline."""

    def __init__(self, module: nn.Module, group: Any, device: torch.device, microbatches: int, schedule: str) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import get_schedule_class

        if not callable(getattr(module, "pipeline_loss", None)):
            raise ConfigurationError(
                f"Pipeline parallel runs forward and backward micro-batch by micro-batch inside its schedule, so "
                f"training_step cannot compute the loss: define {type(module).__name__}.pipeline_loss(output, target) "
                "returning the mean loss of one micro-batch."
            )
        self.module, self.group, self.device = module, group, device
        self.index, self.num_stages = dist.get_rank(group), dist.get_world_size(group)
        self.is_first, self.is_last = self.index == 0, self.index == self.num_stages - 1
        self.last_rank = dist.get_global_rank(group, self.num_stages - 1)
        self.microbatches = microbatches
        self.params = [p for p in module.parameters() if p.requires_grad]
        stage = PipelineStage(module, self.index, self.num_stages, device, group=group)
        self.schedule = get_schedule_class(schedule)(stage, microbatches, loss_fn=self._loss, scale_grads=True)
        self._batch_shape: Optional[torch.Size] = None
        self._eval: dict[tuple, Any] = {}
        self._stashed: Optional[list[Optional[Tensor]]] = None  # gradients from earlier micro-batches of the window
        self.step_loss: Optional[Tensor] = None

    def _loss(self, output: Any, target: Any) -> Tensor:
        return self.module.pipeline_loss(output, target)

    # ------------------------------------------------------------------ training
    def train_step(self, batch: Any) -> Tensor:
        """Forward and backward of every micro-batch; returns the step's loss on every rank of the pipeline.

        The gradients it leaves are this batch's alone; :meth:`finish_backward` scales them as the loop's
        ``backward(loss / accumulate)`` asks and adds them to those of earlier micro-batches of the window.
        """
        self.discard_unfinished()
        inputs, target = split_batch(self.module, batch)
        self._check_batch(inputs[0] if self.is_first else target)
        self._stashed = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        losses: list[Tensor] = []
        if self.is_first:
            self.schedule.step(*inputs)
        elif self.is_last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        loss = torch.stack([l.detach().float() for l in losses]).mean() if self.is_last else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self.last_rank, group=self.group)
        self.step_loss = loss.requires_grad_()
        return self.step_loss

    def _check_batch(self, tensor: Any) -> None:
        shape = tensor.shape if isinstance(tensor, Tensor) else None
        if self._batch_shape is None:
            if shape is None or shape[0] % self.microbatches:
                raise ConfigurationError(
                    f"Pipeline parallel cuts each batch into microbatches={self.microbatches} along dim 0; a batch of "
                    f"{None if shape is None else shape[0]} samples does not divide. Use a batch size that is a multiple "
                    "of microbatches."
                )
            self._batch_shape = shape
        elif shape != self._batch_shape:
            raise ConfigurationError(
                f"Pipeline parallel needs every training batch the same shape (the stages exchange fixed-size "
                f"activations); got {tuple(shape) if shape is not None else shape} after "
                f"{tuple(self._batch_shape)}. Use drop_last=True in the DataLoader."
            )

    def finish_backward(self, scaled_loss: Tensor) -> None:
        """The loop's backward of ``step_loss`` (divided by the accumulation factor): scale this batch's gradients
        by d(scaled_loss)/d(step_loss) and add those of the window's earlier micro-batches."""
        if self._stashed is None or self.step_loss is None:
            raise RuntimeError("backward() under pipeline parallel needs the loss of the step just run.")
        if scaled_loss is not self.step_loss:
            (scale,) = torch.autograd.grad(scaled_loss, self.step_loss)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        for p, earlier in zip(self.params, self._stashed):
            if earlier is not None:
                p.grad = earlier if p.grad is None else earlier.add_(p.grad)
        self._stashed = None

    def discard_unfinished(self) -> None:
        """Drop the gradients of a step whose loss was never backpropagated (e.g. skipped as non-finite)."""
        if self._stashed is not None:
            for p, earlier in zip(self.params, self._stashed):
                p.grad = earlier
            self._stashed = None

    # ------------------------------------------------------------------ evaluation
    def forward(self, inputs: tuple[Any, ...]) -> Tensor:
        """The model's output for ``inputs``, computed through the stages and sent to every pipeline rank."""
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import ScheduleGPipe

        key = tuple(tuple(t.shape) if isinstance(t, Tensor) else None for t in inputs)
        schedule = self._eval.get(key)
        if schedule is None:  # the stages' buffers are shape-specific: one forward-only schedule per input shape
            stage = PipelineStage(self.module, self.index, self.num_stages, self.device, group=self.group)
            schedule = self._eval[key] = ScheduleGPipe(stage, 1)
        output = schedule.step(*inputs) if self.is_first else schedule.step()
        if self.is_last and not isinstance(output, Tensor):
            raise ConfigurationError("Evaluation under pipeline parallel needs forward to return one tensor.")
        meta = [(output.shape, output.dtype) if self.is_last else None]
        dist.broadcast_object_list(meta, src=self.last_rank, group=self.group)
        if not self.is_last:
            output = torch.empty(meta[0][0], dtype=meta[0][1], device=self.device)
        dist.broadcast(output, src=self.last_rank, group=self.group)
        return output


@contextlib.contextmanager
def forward_returns(module: nn.Module, output: Tensor, inputs: tuple[Any, ...]) -> Iterator[None]:
    """While it is active, ``module(*inputs)`` returns ``output`` (the pipeline's result), so an evaluation step
    written as ``self(x)`` runs unchanged on every stage."""

    def pipelined(*args: Any, **kwargs: Any) -> Tensor:
        if len(args) != len(inputs) or any(a is not b for a, b in zip(args, inputs)):
            raise ConfigurationError(
                "Under pipeline parallel an evaluation step may call self(inputs) once, with the batch's inputs; "
                "each stage holds only some layers, so other calls cannot run."
            )
        return output

    module.forward = pipelined  # an instance attribute: nn.Module.__call__ (and FSDP's hooks) call it
    try:
        yield
    finally:
        del module.forward
