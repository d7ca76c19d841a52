"""Accelerate's option classes, as the ``Engine`` takes them: ``Engine(kwargs_handlers=[...],
dataloader_config=..., project_config=...)`` (and ``trainer.accelerate`` exports them under Accelerate's names).

Each class has Accelerate's fields and defaults. ``to_kwargs()`` gives the fields that differ from the defaults,
as Accelerate's handlers do. The Engine reads them once, when it is built; none of them costs anything per step.
"""
from __future__ import annotations

import dataclasses
import enum
from datetime import timedelta
from typing import Any, Callable, Optional

from trainer.strategies.errors import ConfigurationError


class DistributedType(str, enum.Enum):
    """How the job runs, with Accelerate's values (``engine.distributed_type``)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class PrecisionType(str, enum.Enum):
    """Accelerate's ``mixed_precision`` values."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class DDPCommunicationHookType(str, enum.Enum):
    """The DDP gradient communication hooks ``DistributedDataParallelKwargs(comm_hook=...)`` registers."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class KwargsHandler:
    """Base of the ``kwargs_handlers`` classes."""

    def to_kwargs(self) -> dict[str, Any]:
        """The fields set to something other than their default."""
        defaults = type(self)()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) != getattr(defaults, f.name)}  # fmt: skip


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``DistributedDataParallel`` (under ``strategy="ddp"``) and the communication hook it gets."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for the ``torch.amp.GradScaler`` of ``mixed_precision="fp16"``."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``: ``backend`` and ``timeout`` are honoured."""

    backend: Optional[str] = "nccl"
    init_method: Optional[str] = None
    timeout: Optional[timedelta] = None


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for ``engine.autocast(autocast_handler=...)``."""

    enabled: bool = True
    cache_enabled: Optional[bool] = None


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """Arguments for the ``torch.profiler.profile`` that ``engine.profile()`` runs. ``activities``: names
    ("cpu", "cuda", ...); ``schedule_option``: ``torch.profiler.schedule``'s arguments; ``output_trace_dir``: each
    process writes ``profile_<rank>.json`` (a Chrome trace) there when the block ends."""

    activities: Optional[list] = None
    schedule_option: Optional[dict] = None
    on_trace_ready: Optional[Callable] = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: Optional[str] = None

    def build(self) -> Any:
        """The ``torch.profiler.profile`` these settings describe."""
        import torch.profiler

        activities = None
        if self.activities is not None:
            names = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}
            try:
                activities = [getattr(torch.profiler.ProfilerActivity, names[str(a).lower()]) for a in self.activities]
            except (KeyError, AttributeError):
                raise ConfigurationError(f"ProfileKwargs(activities={self.activities!r}): use names from "
                                         f"{sorted(names)}.") from None  # fmt: skip
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option is not None else None
        return torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory, with_stack=self.with_stack,
            with_flops=self.with_flops, with_modules=self.with_modules,
        )  # fmt: skip


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How prepared dataloaders split the data (Accelerate's meaning).

    ``split_batches``: each batch of the original loader is cut into one piece per process (the batch size must
    divide by the process count); otherwise whole batches are dealt to the processes in turn. ``even_batches``:
    when the batches do not divide evenly, the first samples are repeated so every process runs equally many
    full batches (``gather_for_metrics`` drops them again); False gives the last processes one batch fewer.
    ``non_blocking``: copies to the device do not wait. ``use_stateful_dataloader=True`` is what prepared
    loaders always do (``save_state`` records their position, ``load_state`` continues there).
    ``dispatch_batches`` and ``use_seedable_sampler`` are not supported (an error when set): every process reads
    its own share, and shuffled loaders share their generator's state from rank 0.
    """

    split_batches: bool = False
    dispatch_batches: Optional[bool] = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: Optional[int] = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def check(self) -> None:
        """Raise for the settings the Engine cannot honour."""
        for name in ("dispatch_batches", "use_seedable_sampler"):
            if getattr(self, name):
                raise ConfigurationError(
                    f"DataLoaderConfiguration({name}={getattr(self, name)!r}) is not supported by the Engine: every "
                    "process reads its own share of the data, and a shuffled loader's order comes from its "
                    f"generator, shared from rank 0. Leave {name} at its default."
                )


@dataclasses.dataclass
class ProjectConfiguration:
    """Where the run writes: ``project_dir`` (``save_state()`` without a folder writes
    ``project_dir/checkpoints/checkpoint_<iteration>`` when ``automatic_checkpoint_naming``, keeping the last
    ``total_limit``), ``logging_dir`` (the trackers' folder, ``project_dir`` by default)."""

    project_dir: Optional[str] = None
    logging_dir: Optional[str] = None
    automatic_checkpoint_naming: bool = False
    total_limit: Optional[int] = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    def set_directories(self, project_dir: Optional[str] = None) -> None:
        """Set ``project_dir`` (and ``logging_dir`` when it was not set apart)."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir


@dataclasses.dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """``num_steps``: micro-batches per optimizer step. Windows also end at each prepared training loader's last
    batch (``sync_with_dataloader=True``), and schedulers count the skipped steps (``adjust_scheduler=True``);
    those two and ``sync_each_batch`` can only keep their defaults here."""

    num_steps: Optional[int] = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


MIXED_PRECISION = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}
# Our precisions as Accelerate names them (engine.mixed_precision).
ACCELERATE_PRECISION = {"32-true": "no", "64-true": "no", "16-mixed": "fp16", "16-true": "fp16",
                        "bf16-mixed": "bf16", "bf16-true": "bf16"}  # fmt: skip


def precision_from_mixed_precision(value: Any) -> str:
    """Accelerate's ``mixed_precision`` value ("no", "fp16", "bf16") as our precision name."""
    name = value.value if isinstance(value, enum.Enum) else value
    name = "no" if name is False else str(name).lower()  # YAML and argparse give an unquoted no as False
    if name not in MIXED_PRECISION:
        hint = " fp8 is not supported here." if name == "fp8" else ""
        raise ConfigurationError(f"mixed_precision={value!r} is not supported.{hint} Use 'no', 'fp16', 'bf16' or None "
                                 "(the launcher's setting, else 'no').")  # fmt: skip
    return MIXED_PRECISION[name]

