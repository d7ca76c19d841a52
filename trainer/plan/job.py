"""The job a plan describes (module, world, strategy and layout, precision, batch) and the refusals that need no
rank to run: the world size, the layout's sizes, the global batch, what tensor parallel must divide."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from trainer.module import TrainModule
from trainer.strategies.errors import ConfigurationError

#: Strategies a plan runs (their set-up code is what the fake ranks execute). DDP and ZeRO-1 move a whole module
#: to the device (``module.to``), which cannot swap a ``meta`` parameter for a fake one.
STRATEGIES = ("fsdp", "zero2", "nd_parallel")
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "sgd_momentum": "SGD", "rmsprop": "RMSprop",
              "adagrad": "Adagrad"}  # fmt: skip
_HEADS = ("num_attention_heads", "n_heads", "n_head", "num_heads")
_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "n_kv_head", "num_kv_heads")
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_VOCAB = ("vocab_size", "n_vocab")
_LAYERS = ("num_hidden_layers", "n_layers", "n_layer", "num_layers")


@dataclasses.dataclass
class JobSpec:
    """What ``trainer plan`` plans: ``build`` makes the module (on ``meta``), the rest is the command's flags."""

    build: Callable[[], nn.Module]
    module_name: str
    nodes: int = 1
    devices_per_node: int = 1
    strategy: str = "fsdp"
    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    microbatches: Optional[int] = None
    schedule: str = "1F1B"
    precision: str = "32-true"
    micro_batch_size: Optional[int] = None
    seq_len: Optional[int] = None
    accumulate: Optional[int] = None
    global_batch_size: Optional[int] = None
    optimizer: str = "adamw"
    wrap: tuple[str, ...] = ()
    activation_checkpointing: tuple[str, ...] = ()
    tp_plan: Any = None

    @property
    def world_size(self) -> int:
        """nodes × devices per node."""
        return self.nodes * self.devices_per_node

    def layout(self) -> Any:
        """The mesh sizes (``nd_parallel``) or pure data parallel over every rank (the other strategies)."""
        from trainer.strategies.nd.mesh import MeshLayout, resolve_layout

        if self.strategy == "nd_parallel":
            return resolve_layout(self.world_size, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard, tp=self.tp,
                                  pp=self.pp)  # fmt: skip
        return MeshLayout(dp_shard=self.world_size)


def check_job(spec: JobSpec, world_size: Optional[int]) -> None:
    """The refusals that need no rank to run: raise :class:`ConfigurationError` naming the constraint."""
    if world_size is not None and world_size != spec.world_size:
        raise ConfigurationError(
            f"--world-size {world_size} is not --nodes {spec.nodes} × --devices-per-node {spec.devices_per_node} = "
            f"{spec.world_size}: the job starts one process per device. Fix one of the three."
        )
    if spec.strategy not in STRATEGIES:
        raise ConfigurationError(
            f"--strategy {spec.strategy!r} cannot be planned (its set-up moves the whole module to the device, which a "
            f"dry run on meta cannot do); plan one of {', '.join(STRATEGIES)} (ddp holds what fsdp gathers: the whole "
            "model, gradients and optimizer state on every rank)."
        )
    if spec.strategy != "nd_parallel" and (spec.tp > 1 or spec.pp > 1 or spec.dp_replicate > 1):
        raise ConfigurationError(
            f"--tp/--pp/--dp-replicate lay out an N-D mesh, which --strategy {spec.strategy} does not have. "
            "Use --strategy nd_parallel."
        )
    if spec.optimizer not in OPTIMIZERS:
        raise ConfigurationError(f"--optimizer {spec.optimizer!r} is not known; use one of {', '.join(OPTIMIZERS)}.")
    if (spec.micro_batch_size is None) != (spec.seq_len is None):
        raise ConfigurationError("--micro-batch-size and --seq-len go together: the plan's batch is that many "
                                 "sequences of that many tokens.")  # fmt: skip
    layout = spec.layout()
    if spec.global_batch_size is not None:
        _check_global_batch(spec, layout.dp)


def _check_global_batch(spec: JobSpec, dp: int) -> None:
    micro = spec.micro_batch_size
    if micro is None:
        raise ConfigurationError("--global-batch-size needs --micro-batch-size (sequences per rank per micro-batch).")
    accumulate = spec.accumulate
    per_step = dp * micro * (accumulate or 1)
    if spec.global_batch_size % per_step or (accumulate is not None and spec.global_batch_size != per_step):
        what = f" × --accumulate {accumulate}" if accumulate else ""
        raise ConfigurationError(
            f"--global-batch-size {spec.global_batch_size} is not a multiple of the {dp} data-parallel ranks × "
            f"--micro-batch-size {micro}{what} = {per_step}: every rank of every step takes whole micro-batches. "
            f"Use a global batch of {per_step * max(1, spec.global_batch_size // per_step)}, or change the sizes."
        )
    spec.accumulate = spec.global_batch_size // (dp * micro)


def first_attribute(module: nn.Module, names: tuple[str, ...]) -> Optional[tuple[str, int]]:
    """The first of ``names`` set to an int on the module, its ``config``/``hparams``, or a submodule: (name, value)."""
    holders: list[Any] = [module, getattr(module, "config", None), getattr(module, "hparams", None)]
    for sub in module.modules():
        holders += [getattr(sub, "config", None)] + ([sub] if sub is not module else [])
    for holder in holders:
        if holder is None:
            continue
        for name in names:
            value = holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return name, value
    return None


def check_divisible_by_tp(module: nn.Module, tp: int) -> None:
    """Heads, KV heads, hidden width and vocabulary must split evenly over ``tp`` ranks (read from the module,
    its ``config`` or ``hparams``): an uneven split fails at start-up or, worse, reshapes heads wrongly."""
    if tp <= 1:
        return
    for what, names in (("attention heads", _HEADS), ("key/value heads", _KV_HEADS), ("hidden size", _HIDDEN),
                        ("vocabulary", _VOCAB)):  # fmt: skip
        found = first_attribute(module, names)
        if found is None:
            continue
        name, value = found
        if value % tp:
            fits = [d for d in range(1, tp) if value % d == 0 and tp % d == 0]
            raise ConfigurationError(
                f"every tensor-parallel rank: --tp {tp} does not divide the {value} {what} "
                f"({name}): each of the {tp} ranks of a tp group would hold {value / tp:g}. Use --tp "
                f"{max(fits)} (or another divisor of {value})."
            )


def layer_count(module: nn.Module) -> Optional[int]:
    """The number of transformer layers, where the module says (``n_layers``, ``num_hidden_layers``, ...)."""
    found = first_attribute(module, _LAYERS)
    return found[1] if found else None


class PlainModule(TrainModule):
    """A plain ``nn.Module`` made trainable for the plan: its forward on the batch, the mean of the output as the
    loss, the optimizer the command names; ``--tp`` applies ``tp_plan`` in ``configure_model``."""

    def __init__(self, model: nn.Module, optimizer: str, tp_plan: Any = None) -> None:
        super().__init__()
        self.model = model
        self._optimizer = optimizer
        self._tp_plan = tp_plan
        self.example_input_array = getattr(model, "example_input_array", None)

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if self._tp_plan is not None and mesh is not None and "tp" in (mesh.mesh_dim_names or ()) and mesh["tp"].size() > 1:
            from torch.distributed.tensor.parallel import parallelize_module

            plan = self._tp_plan(self.model) if callable(self._tp_plan) else self._tp_plan
            parallelize_module(self.model, mesh["tp"], plan)

    def forward(self, *args: Any) -> Any:
        return self.model(*args)

    def training_step(self, batch: Any, batch_idx: int = 0) -> Tensor:
        output = self(*batch) if isinstance(batch, (tuple, list)) else self(batch)
        while isinstance(output, (tuple, list)):
            output = output[0]
        if isinstance(output, dict):
            output = next(v for v in output.values() if isinstance(v, Tensor))
        if hasattr(output, "full_tensor") and hasattr(output, "to_local"):
            output = output.to_local()
        return output.float().mean()

    def configure_optimizers(self) -> Any:
        cls = getattr(torch.optim, OPTIMIZERS[self._optimizer])
        extra = {"momentum": 0.9} if self._optimizer == "sgd_momentum" else {}
        return cls(self.parameters(), lr=1e-3, **extra)


def make_module(spec: JobSpec) -> TrainModule:
    """The user's module built on ``meta`` (a plain ``nn.Module`` wrapped in :class:`PlainModule`)."""
    with torch.device("meta"):
        module = spec.build()
    if not isinstance(module, TrainModule):
        module = PlainModule(module, spec.optimizer, spec.tp_plan)
    return module


def make_batch(spec: JobSpec, module: nn.Module, device: torch.device) -> Any:
    """One micro-batch of one data-parallel rank, made where it is called (inside ``FakeTensorMode``: fake):
    ``(tokens, targets)`` of ``micro_batch_size × seq_len`` token ids with ``--seq-len``, else the module's
    ``example_input_array`` (its shapes and dtypes; integer inputs are zeros, a valid index)."""
    if spec.seq_len is not None:
        shape = (spec.micro_batch_size, spec.seq_len)
        return torch.zeros(shape, dtype=torch.long, device=device), torch.zeros(shape, dtype=torch.long, device=device)
    example = getattr(module, "example_input_array", None)
    if example is None:
        raise ConfigurationError(
            f"{spec.module_name}: the plan needs a batch. Pass --micro-batch-size and --seq-len (a language-model "
            "batch of token ids, (tokens, targets)), or set example_input_array on the module (one micro-batch "
            "of one data-parallel rank; a TrainModule's training_step gets it as its batch)."
        )
    return _like(example, device)


def _like(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        return torch.zeros(value.shape, dtype=value.dtype, device=device)
    if isinstance(value, (list, tuple)):
        return type(value)(_like(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _like(v, device) for k, v in value.items()}
    return value


def tokens_per_step(spec: JobSpec, dp: int) -> Optional[int]:
    """Tokens the whole job trains on per optimizer step (``None`` without ``--seq-len``)."""
    if spec.seq_len is None:
        return None
    return math.prod((spec.micro_batch_size, spec.seq_len, dp, spec.accumulate or 1))
