"""The ``Strategy`` interface: where and how a module runs.

A strategy places and wraps the module, moves batches, runs backward and the optimizer step through its
precision plugin, provides collectives, and saves/loads checkpoints. It knows nothing about the Trainer or
the Engine: both drive it through this interface, so one implementation serves both.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.checkpoint.checkpoint_io import CheckpointIO, atomic_save, remove_checkpoint, safe_load
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision.base import Precision

if TYPE_CHECKING:  # pragma: no cover
    from trainer.strategies.checkpoint.async_checkpoint import BackgroundWriter

_NULL_CONTEXT = contextlib.nullcontext()


def move_to_device(data: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to ``device``; other values pass through."""
    if isinstance(data, Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return type(data)((k, move_to_device(v, device)) for k, v in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(move_to_device(v, device) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(move_to_device(v, device) for v in data)
    if hasattr(data, "to") and callable(data.to):  # e.g. a user batch class with .to(device)
        return data.to(device)
    return data


def materialize_on(module: nn.Module, device: torch.device) -> None:
    """A module built on the ``meta`` device gets storage on ``device`` and is initialised (unsharded strategies)."""
    if any(p.is_meta for p in module.parameters()) or any(b.is_meta for b in module.buffers()):
        from trainer.strategies.speed.deferred_init import materialize

        materialize(module, device)


class Strategy:
    """Base strategy: one process, one device. Subclasses override what they change.

    Capabilities are plain attributes rather than mixins: ``is_distributed`` (several processes),
    ``is_sharded`` (parameters or optimizer state split across ranks), ``launcher`` (an object that starts
    the other processes, or ``None``), ``runs_forward`` (the runner ``setup_module`` returns computes the
    module's ``forward``, so a hand-written loop can call it; False where it runs ``training_step``).

    Several modules may be set up (the Engine prepares each one a user passes): ``module``/``model`` are the
    last one, and the per-module methods take the module they act on as an optional argument.
    """

    strategy_name: str = "single_device"
    is_distributed: bool = False
    is_sharded: bool = False
    runs_forward: bool = True

    def __init__(self, precision: Optional[Precision] = None) -> None:
        self.precision: Precision = precision if precision is not None else Precision()
        self._precision_given = precision is not None
        self._root_device = torch.device("cpu")
        self.module: Optional[nn.Module] = None  # the user's module, unwrapped
        self.model: Optional[nn.Module] = None  # what runs the forward (may be a DDP/DP wrapper)
        self.launcher: Any = None
        #: Writes, reads and deletes single-file checkpoints when set (``Trainer(plugins=[CheckpointIO()])``).
        self.checkpoint_io: Optional[CheckpointIO] = None
        self._clip_params: dict[int, list[Tensor]] = {}
        self._cuda_copy: Any = None  # a SideStreamCopy, made at the first CUDA batch

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        """Fill in what the user did not set on this instance: devices, node count, precision plugin.

        Called by the connector with the resolved ``accelerator``/``devices``/``num_nodes``/``precision``
        arguments, so a user-built instance (``DDPStrategy(find_unused_parameters=True)``) is completed
        rather than replaced.
        """
        if precision is not None and not self._precision_given:
            self.precision = precision
        if devices:
            self._root_device = devices[0]

    # ------------------------------------------------------------------ topology
    #: Whether a fit reads its checkpoint only after ``configure_optimizers`` (Lightning's strategy property of this
    #: name): where reading it needs the optimizers (DeepSpeed's engine, the optimizer shards of a sharded folder).
    #: Otherwise the module's and callbacks' state come first, in Lightning's order.
    restore_checkpoint_after_setup: bool = False

    @property
    def root_device(self) -> torch.device:
        """The device this process computes on."""
        return self._root_device

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return 1

    @property
    def global_rank(self) -> int:
        """This process's rank in the whole job."""
        return 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its node."""
        return 0

    @property
    def node_rank(self) -> int:
        """This process's node index."""
        return 0

    @property
    def is_global_zero(self) -> bool:
        """True on the process that writes logs and checkpoints."""
        return self.global_rank == 0

    @property
    def distributed_sampler_kwargs(self) -> Optional[dict[str, int]]:
        """``num_replicas``/``rank`` for a ``DistributedSampler``, or ``None`` when data is not split."""
        return None

    def setup_environment(self) -> None:
        """Prepare the process (device selection, process group). Called once per fit/validate/test."""
        self.precision.setup(self.root_device)

    @property
    def device_mesh(self) -> Any:
        """The ``DeviceMesh`` the module is laid out on (``TrainModule.device_mesh``); ``None`` without one."""
        return None

    # ------------------------------------------------------------------ module and optimizers
    def module_init_context(self, empty_init: Optional[bool] = None) -> ContextManager:
        """Where ``Trainer.init_module()`` and ``configure_model()`` build modules: this process's device in the
        precision's dtype; ``empty_init=True`` skips random initialisation (weights about to be loaded).
        Sharded strategies build on the ``meta`` device instead (see :mod:`trainer.strategies.speed.deferred_init`)."""
        from trainer.strategies.speed.deferred_init import module_init_context

        return module_init_context(self._init_device(), self.precision, empty_init, meta=False)

    def _init_device(self) -> torch.device:
        return self.root_device

    def build_module(self, module: nn.Module, build: Callable[[], None],
                     check_init: bool = False) -> Optional[dict[str, torch.Tensor]]:  # fmt: skip
        """Run ``build`` (``configure_model()`` and the root's ``init_weights()``) in :meth:`module_init_context`;
        a build on ``meta`` that cannot be replayed exactly is redone eagerly
        (:func:`trainer.strategies.speed.module_build.build_module`). With ``check_init``, returns the eager
        one-device build's tensors by name, for :func:`~trainer.strategies.speed.init_check.verify_initial_weights`."""
        from trainer.strategies.speed.deferred_init import module_init_context
        from trainer.strategies.speed.module_build import build_module

        def eager(device: torch.device) -> ContextManager:
            return module_init_context(device, self.precision, None, meta=False)

        return build_module(module, build, self.module_init_context, eager, self._init_device(), check_init)

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Convert the module for the precision, move it to the device and wrap it. Returns the runner."""
        materialize_on(module, self.root_device)
        self.module = self.precision.convert_module(module).to(self.root_device)
        self.model = self.module
        return self.model

    def compile_module(self, module: nn.Module, options: dict[str, Any]) -> None:
        """``torch.compile`` a module this strategy set up, in place, where its wrapper needs it (here: the module's
        forward; see :mod:`trainer.strategies.speed.compile`). ``options`` are ``torch.compile``'s keyword arguments."""
        from trainer.strategies.speed.compile import compile_forward

        compile_forward(module, options)

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        """Wrap or shard optimizers (identity here)."""
        self._clip_params.clear()
        return optimizers

    @property
    def moves_batches(self) -> bool:
        """False when :meth:`batch_to_device` would return every batch as it is (the CPU, no input conversion),
        so a loop may skip the call. One set on the instance (a profiler's timing wrapper) is always called."""
        return self._has_own("batch_to_device") or self.root_device.type != "cpu" or self.precision.converts_input

    @property
    def plain_steps(self) -> bool:
        """True when :meth:`training_step`, :meth:`backward` and :meth:`optimizer_step` would only call the
        module's ``training_step``, ``loss.backward()`` and ``optimizer.step()`` (no wrapper, precision context,
        loss scaling or gradient synchronisation), so a loop may make those calls itself. A method set on the
        instance (a profiler's timing wrapper) makes it False."""
        if any(self._has_own(name) for name in ("training_step", "backward", "optimizer_step", "backward_sync")):
            return False
        precision = self.precision
        return (precision.plain_forward and precision.plain_backward and precision.plain_unscale
                and "optimizer_step" not in vars(precision)
                and type(precision).optimizer_step is Precision.optimizer_step)  # fmt: skip

    def _has_own(self, name: str) -> bool:
        """True when this strategy's class, or the instance itself, defines ``name`` differently from Strategy."""
        return name in vars(self) or getattr(type(self), name) is not getattr(Strategy, name)

    def batch_to_device(self, batch: Any) -> Any:
        """Move a batch to this process's device and convert it for the precision. On CUDA the copy runs on a
        side stream (:mod:`trainer.strategies.speed.cuda_copy`); on the CPU the batch is returned as it is."""
        device = self.root_device
        if device.type == "cuda":
            copy = self._cuda_copy
            if copy is None or copy.device != device:
                from trainer.strategies.speed.cuda_copy import SideStreamCopy

                copy = self._cuda_copy = SideStreamCopy(device)
            batch = copy(batch)
        elif device.type != "cpu":  # batches from a DataLoader are already on the CPU
            batch = move_to_device(batch, device)
        if self.precision.converts_input:
            batch = self.precision.convert_input(batch)
        return batch

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any) -> Any:
        """Run ``module.training_step`` inside the precision's forward context."""
        if self.precision.plain_forward:
            return self.module.training_step(*args)
        with self.precision.forward_context():
            return self.module.training_step(*args)

    def evaluation_step(self, step_name: str, *args: Any) -> Any:
        """Run ``validation_step``/``test_step``/``predict_step`` (no gradient synchronisation needed)."""
        with self.precision.forward_context():
            return getattr(self.module, step_name)(*args)

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the precision plugin (which scales the loss where needed); extra arguments go to
        ``Tensor.backward`` (e.g. ``retain_graph=True``)."""
        if self.precision.plain_backward:
            loss.backward(*args, **kwargs)
        else:
            self.precision.backward(loss, *args, **kwargs)

    def backward_through(self, backward: Callable[..., Any], loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward done by ``backward`` (a module's own ``backward(loss, *args, **kwargs)`` hook) instead of
        ``loss.backward``: it gets the loss as :meth:`backward` would propagate it (scaled by the precision plugin
        where it scales) and the extra arguments."""
        backward(self.precision.scale_loss(loss), *args, **kwargs)

    def backward_sync(self, should_sync: bool, model: Optional[nn.Module] = None) -> ContextManager:
        """Context for one micro-batch: distributed strategies skip the gradient all-reduce when False.

        ``model`` is a runner returned by :meth:`setup_module` (default: the last one set up).
        """
        return _NULL_CONTEXT

    def optimizer_step(
        self, optimizer: Optimizer, before_step: Callable[[], None], closure: Optional[Callable[[], Any]] = None,
        **kwargs: Any,
    ) -> bool:
        """Unscale → ``before_step`` (hooks, clipping) → step → scaler update. False when the step was skipped.
        ``kwargs`` go to the optimizer's ``step`` (as Lightning passes ``optimizer.step(closure, **kwargs)``'s)."""
        return self.precision.optimizer_step(optimizer, before_step, closure, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Make ``optimizer``'s gradients true gradients (undo loss scaling); idempotent within a step."""
        self.precision.unscale_gradients(optimizer)

    def clip_gradients(self, optimizer: Optimizer, clip_val: float, algorithm: str = "norm") -> Optional[Tensor]:
        """Clip the gradients of ``optimizer``'s parameters by total norm or by value (after unscaling)."""
        self.unscale_gradients(optimizer)
        params = self._clip_params.get(id(optimizer))
        if params is None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._clip_params[id(optimizer)] = params
        return self.clip_parameters(params, clip_val, algorithm)

    def clip_parameters(
        self, parameters: list[Tensor], clip_val: float, algorithm: str = "norm", norm_type: float = 2.0
    ) -> Optional[Tensor]:
        """Clip already unscaled gradients of ``parameters``; returns the total norm (``algorithm="norm"``).

        Sharded strategies override this where the norm must be reduced over the shards.
        """
        if algorithm == "norm":
            return torch.nn.utils.clip_grad_norm_(parameters, clip_val, norm_type=norm_type)
        torch.nn.utils.clip_grad_value_(parameters, clip_val)
        return None

    # ------------------------------------------------------------------ collectives (one process: identity)
    def barrier(self, name: Optional[str] = None) -> None:
        """Wait until every process reaches this point."""

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Send a picklable object from ``src`` to every process."""
        return obj

    def all_gather(self, tensor: Tensor) -> Tensor:
        """Gather a tensor from every process; the result has a new leading dimension of size world_size."""
        return tensor.unsqueeze(0)

    def reduce(self, tensor: Tensor, op: str = "mean") -> Tensor:
        """Reduce a tensor across processes with ``op`` in {"mean", "sum", "max", "min"}."""
        return tensor

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a flag: ``all=True`` → every rank must say True; ``False`` → any rank suffices."""
        return decision

    def join_replicas(self, state: Callable[[], dict[str, Any]], load: Callable[[dict[str, Any]], None],
                      global_step: int) -> None:  # fmt: skip
        """Training is about to start at ``global_step``: a fault-tolerant strategy joins its replica groups here and
        may ``load`` a live peer's training state (its ``state()``, the in-memory checkpoint). Nothing here."""

    def after_first_step(self) -> None:
        """Training has taken its first optimizer step (multi-process strategies shorten their timeout here)."""

    def unresponsive_ranks(self) -> Optional[list[int]]:
        """After a collective timed out: the ranks that stopped answering, or ``None`` when that cannot be told."""
        return None

    # ------------------------------------------------------------------ checkpoints
    def module_state_dict(self, module: Optional[nn.Module] = None) -> dict[str, Any]:
        """The state dict a checkpoint holds for ``module`` (a module this strategy set up; default the last):
        full here; a sharded strategy chooses (its shards, or gathered)."""
        return (self.module if module is None else module).state_dict()

    def load_module_state_dict(
        self, state_dict: dict[str, Any], strict: bool = True, module: Optional[nn.Module] = None
    ) -> Any:
        """Load a full state dict into ``module`` (default the last set up), however it is wrapped or sharded."""
        return (self.module if module is None else module).load_state_dict(state_dict, strict=strict)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer state a checkpoint holds: full here; a sharded strategy chooses (its shards, or full)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Restore an optimizer's state dict."""
        optimizer.load_state_dict(state)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        """Write ``checkpoint`` atomically; only global rank 0 writes."""
        if self.is_global_zero:
            if self.checkpoint_io is not None:
                self.checkpoint_io.save_checkpoint(checkpoint, path)
            else:
                atomic_save(checkpoint, path)

    def save_checkpoint_async(self, checkpoint: dict[str, Any], path: str | Path, writer: "BackgroundWriter") -> None:
        """Copy ``checkpoint``'s tensors now and write it in ``writer``'s thread (global rank 0 writes); see
        :mod:`trainer.strategies.checkpoint.async_checkpoint`."""
        if type(self).save_checkpoint is not Strategy.save_checkpoint:
            raise ConfigurationError(
                f"{type(self).__name__} writes its checkpoints itself and has no asynchronous mode; save with "
                "asynchronous=False."
            )
        if self.is_global_zero:
            writer.save_file(checkpoint, path)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Read a checkpoint file safely (``weights_only=True``). The built-in strategies also read sharded folders
        (:class:`~trainer.strategies.checkpoint.whole_folder.WholeFolderLoading`); the interface knows files
        only."""
        if self.checkpoint_io is not None:
            return self.checkpoint_io.load_checkpoint(path, map_location="cpu")
        return safe_load(path, map_location="cpu")

    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete a checkpoint this strategy wrote (file or folder); global rank 0 deletes."""
        if self.is_global_zero:
            if self.checkpoint_io is not None:
                self.checkpoint_io.remove_checkpoint(path)
            else:
                remove_checkpoint(path)

    def teardown(self) -> None:
        """Release resources (process group, device caches)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.root_device}, precision={self.precision.name!r})"
