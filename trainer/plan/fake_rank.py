"""One rank of the job, run in this process on torch's ``fake`` process group: the strategy's own set-up (sharding,
TP plan, pipeline cut) on the module built on ``meta``, then one step on fake tensors, measured."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from trainer.plan.job import JobSpec, make_batch, make_module
from trainer.plan.measure import StepMeasure, held_bytes, measure_optimizer_step, measure_step
from trainer.strategies.launch.environments.base import ClusterEnvironment

_CPU = torch.device("cpu")


class PlannedEnvironment(ClusterEnvironment):
    """The topology of one planned rank (nothing is launched: the strategy joins the fake process group)."""

    def __init__(self, world: int, rank: int, devices_per_node: int) -> None:
        self._world, self._rank, self._per_node = world, rank, devices_per_node

    def world_size(self) -> int:
        return self._world

    def global_rank(self) -> int:
        return self._rank

    def local_rank(self) -> int:
        return self._rank % self._per_node

    def node_rank(self) -> int:
        return self._rank // self._per_node

    def local_world_size(self) -> int:
        return self._per_node


class _Host:
    """What a module asks of its Trainer while it is set up and stepped: the strategy (``device_mesh``), its ranks."""

    _results = None
    logger = None
    loggers: list = []
    current_epoch = global_step = 0

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.global_rank, self.local_rank = strategy.global_rank, strategy.local_rank
        self.world_size = strategy.world_size


@dataclasses.dataclass
class RankResult:
    """One planned rank: what it holds after the step and what the step did."""

    rank: int
    held: dict[str, int]
    step: StepMeasure


def _refuse_an_existing_process_group() -> None:
    """A fake rank replaces the default process group, so the process must not have one already (a RuntimeError, not
    a ConfigurationError: no layout would be accepted, so none is passed over for it)."""
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            f"trainer plan needs a process without a torch.distributed process group, and this one has one (rank "
            f"{dist.get_rank()} of {dist.get_world_size()}, e.g. left by an in-process fit). Run `trainer plan` from "
            "a shell, or call it before init_process_group() or after torch.distributed.destroy_process_group().")


@contextlib.contextmanager
def fake_process_group(world: int, rank: int) -> Iterator[None]:
    """The default process group is torch's ``fake`` backend (collectives do nothing) of ``world`` ranks, as ``rank``."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _refuse_an_existing_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def make_strategy(spec: JobSpec) -> Any:
    """The strategy the job would build (its constructor's checks run here)."""
    from trainer.strategies.data_parallel.fsdp import FSDPStrategy
    from trainer.strategies.precision import precision_plugin

    policy = None
    kwargs: dict[str, Any] = {"precision": precision_plugin(spec.precision)}
    if spec.strategy == "nd_parallel":
        from trainer.strategies.nd.nd_parallel import NDParallelStrategy

        return NDParallelStrategy(dp_replicate=spec.dp_replicate, dp_shard=spec.dp_shard, tp=spec.tp, pp=spec.pp,
                                  microbatches=spec.microbatches if spec.pp > 1 else None,
                                  pipeline_schedule=spec.schedule, auto_wrap_policy=policy, **kwargs)  # fmt: skip
    from trainer.strategies.data_parallel.zero import Zero2Strategy

    return (FSDPStrategy if spec.strategy == "fsdp" else Zero2Strategy)(auto_wrap_policy=policy, **kwargs)


def _wrap_classes(module: nn.Module, names: tuple[str, ...], flag: str) -> tuple[type, ...]:
    from trainer.strategies.errors import ConfigurationError

    classes = {type(m).__name__: type(m) for m in module.modules()}
    unknown = sorted(set(names) - set(classes))
    if unknown:
        raise ConfigurationError(f"{flag} {','.join(names)}: the module has no submodule of class {unknown} "
                                 f"(it has {sorted(classes)[:12]}).")  # fmt: skip
    return tuple(classes[name] for name in names)


def plan_rank(spec: JobSpec, rank: int) -> RankResult:
    """Set up rank ``rank`` of the job with the strategy's own code and run one step on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainer.loops.optimizers import parse_optimizers
    from trainer.module import TrainModule
    from trainer.strategies.speed.deferred_init import allocate_only, module_init_context

    with fake_process_group(spec.world_size, rank):
        strategy = make_strategy(spec)
        strategy.cluster_environment = PlannedEnvironment(spec.world_size, rank, spec.devices_per_node)
        strategy.connect([_CPU] * spec.devices_per_node, spec.nodes, None)
        strategy._ranks = (spec.world_size, rank, rank % spec.devices_per_node, rank // spec.devices_per_node)
        strategy.device_mesh  # noqa: B018 (built now: DeviceMesh cannot be made under FakeTensorMode)
        module = make_module(spec)
        module._trainer = _Host(strategy)
        module.__dict__["_log_warned"] = True  # self.log in the step has nowhere to go, and that is expected
        if type(module).configure_model is not TrainModule.configure_model:
            with module_init_context(_CPU, strategy.precision, empty_init=True, meta=True):
                module.configure_model()  # on meta, not initialised: a plan needs shapes, not values
        if spec.wrap:
            strategy.auto_wrap_policy = _wrap_classes(module, spec.wrap, "--wrap")
        if spec.activation_checkpointing:
            from trainer.strategies.speed.activation_checkpointing import apply_activation_checkpointing

            apply_activation_checkpointing(module, _wrap_classes(module, spec.activation_checkpointing,
                                                                 "--activation-checkpointing"))  # fmt: skip
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with allocate_only(mode):
            strategy.setup_module(module)
        optimizers, _ = parse_optimizers(module.configure_optimizers(), module.automatic_optimization)
        optimizers = strategy.setup_optimizers(optimizers)
        with mode:
            batch = make_batch(spec, module, _CPU)
            if getattr(strategy, "_pipeline", None) is not None:
                step = measure_optimizer_step(strategy, module, optimizers, _stage_flops(spec, module, batch))
            else:
                step = measure_step(strategy, module, optimizers, batch)
            held = held_bytes(module, optimizers)
        module._trainer = None
    return RankResult(rank, held, step)


def _stage_flops(spec: JobSpec, module: nn.Module, batch: Any) -> int:
    """6 FLOPs per parameter per token (forward and backward of the matmuls) for this stage's share of the
    parameters (this rank's local part × the data-parallel shards) over one data-parallel rank's batch."""
    tokens = batch[0].numel() if isinstance(batch, (tuple, list)) else getattr(batch, "numel", lambda: 1)()
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in module.parameters())
    layout = spec.layout()
    return 6 * local * layout.dp_shard * tokens


def plan_rank_isolated(spec: JobSpec, rank: int) -> RankResult:
    """:func:`plan_rank` in a forked child process: each fake rank starts from a process with no process group and
    none of DTensor's caches (they key sharding decisions by a mesh's shape, so a later rank's equal-looking mesh
    would reuse an earlier rank's destroyed groups), and its memory is returned when it ends."""
    import multiprocessing
    import traceback

    from trainer.strategies.errors import ConfigurationError

    _refuse_an_existing_process_group()  # a forked child would inherit it
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            outcome: tuple[str, Any] = ("ok", plan_rank(spec, rank))
        except ConfigurationError as err:
            outcome = ("refused", str(err))
        except BaseException:  # noqa: BLE001 (everything goes back to the parent, which raises it)
            outcome = ("failed", traceback.format_exc())
        send.send(outcome)
        send.close()

    process = context.Process(target=child, name=f"plan-rank-{rank}", daemon=True)
    process.start()
    send.close()
    try:
        kind, value = receive.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"The planned rank {rank} ended without a result (exit code {process.exitcode}).") from None
    process.join()
    if kind == "refused":
        raise ConfigurationError(value)
    if kind == "failed":
        raise RuntimeError(f"Planning rank {rank} failed:\n{value}")
    return value
