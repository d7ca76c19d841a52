"""``Fabric``: Lightning Fabric's API over the Engine core (composition: one :class:`~trainer.engine.Engine` holds
the strategy, precision, data splitting and prepared objects; this class only speaks Fabric's names)::

    fabric = Fabric(devices=2, strategy="ddp", precision="bf16-mixed", loggers=CSVLogger("logs"))
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    for step, (x, y) in enumerate(loader):
        with fabric.no_backward_sync(model, enabled=(step + 1) % 4 != 0):   # accumulate 4 micro-batches
            fabric.backward(loss_fn(model(x), y))
        if (step + 1) % 4 == 0:
            fabric.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
            optimizer.zero_grad()
    fabric.save("state.ckpt", {"model": model, "optimizer": optimizer, "step": step})

As in Fabric, the loop decides when to synchronise and step: ``backward`` does not divide the loss and prepared
optimizers step at every call (the Engine's accumulation window stays at one micro-batch).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Union

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from trainer.config.plugins import apply_to_strategy, sort_plugins
from trainer.engine.engine import Engine
from trainer.engine.wrappers import EngineDataLoader, EngineOptimizer
from trainer.fabric.state import (load_state, save_sharded_state, save_state, sharded_entries, state_of,
                                   whole_state_dicts)
from trainer.fabric.wrappers import FabricModule
from trainer.loggers.logger import Logger
from trainer.reproducibility.seed import seed_everything as _seed_everything
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.strategy import Strategy

_BACKWARD_ARGUMENTS = ("gradient", "retain_graph", "create_graph", "inputs")
_REDUCE_OPS = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}


def _run_with_fabric(engine: Engine, fabric: "Fabric", function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """What ``Engine.launch`` runs in each rank for ``Fabric.launch(function, ...)``: Fabric passes itself."""
    fabric._engine = engine
    return function(fabric, *args, **kwargs)


def _to_tensors(data: Any, device: torch.device, what: str) -> Any:
    if isinstance(data, Tensor):
        return data
    if isinstance(data, (bool, int, float)):
        return torch.tensor(data, device=device)
    if isinstance(data, dict):
        return type(data)((key, _to_tensors(value, device, what)) for key, value in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(_to_tensors(value, device, what) for value in data)
    raise ConfigurationError(f"{what} takes tensors or numbers (or dicts/lists/tuples of them); got "
                             f"{type(data).__name__}. Use fabric.broadcast(obj) for other Python objects.")  # fmt: skip


class Fabric:
    """Lightning Fabric's ``Fabric``: distributed training, mixed precision and checkpoints for a loop you write.

    Arguments are Fabric's: ``accelerator``, ``strategy``, ``devices``, ``num_nodes``, ``precision`` (the
    Trainer's names and values, validated identically; None is ``"32-true"``), ``plugins`` (a precision plugin or
    a checkpoint IO), ``callbacks`` (objects whose methods :meth:`call` runs) and ``loggers`` (``trainer.loggers``
    Logger instances that :meth:`log` writes to).

    From a plain ``python script.py`` with several devices the other ranks start when the Fabric is created (they
    re-run the script), so :meth:`launch` with no function only marks the script as launched; a spawn strategy
    (``"ddp_spawn"``, a notebook's ``DDPStrategy(start_method="fork")``) starts them in ``launch(fn)``.
    """

    def __init__(
        self,
        accelerator: str = "auto",
        strategy: Union[str, Strategy] = "auto",
        devices: Union[str, int, list[int]] = "auto",
        num_nodes: int = 1,
        precision: Union[str, int, None] = None,
        plugins: Any = None,
        callbacks: Any = None,
        loggers: Union[Logger, Iterable[Logger], None] = None,
    ) -> None:
        precision = "32-true" if precision is None else precision
        settings = sort_plugins(plugins, precision)
        if settings.cluster_environment is not None or settings.layer_sync is not None:
            kind = "cluster environment" if settings.cluster_environment is not None else "layer sync"
            raise ConfigurationError(
                f"Fabric(plugins=...) got a {kind}, which Fabric here does not take: start the job with torchrun, "
                "SLURM or `trainer run` (the environment is detected), and convert BatchNorm layers yourself with "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before fabric.setup(model)."
            )
        self._loggers = self._check_loggers(loggers)
        self._callbacks = self._check_callbacks(callbacks)
        self._engine = Engine(accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy=strategy,
                              precision=settings.precision or precision)  # fmt: skip
        apply_to_strategy(self._engine.strategy, settings)
        self._launched = False

    @staticmethod
    def _check_loggers(loggers: Any) -> list[Logger]:
        items = [] if loggers is None else list(loggers) if isinstance(loggers, (list, tuple)) else [loggers]
        for item in items:
            if not isinstance(item, Logger):
                raise ConfigurationError(
                    f"Fabric(loggers={item!r}) is not a logger. Pass trainer.loggers instances, e.g. "
                    "loggers=[CSVLogger('logs'), TensorBoardLogger('logs')] (from trainer.loggers import ...)."
                )
        return items

    @staticmethod
    def _check_callbacks(callbacks: Any) -> list[Any]:
        items = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        for item in items:
            if isinstance(item, (str, type)):
                raise ConfigurationError(f"Fabric(callbacks={item!r}): a callback is an object whose methods "
                                         "fabric.call(hook_name, ...) runs; pass an instance.")  # fmt: skip
        return items

    # ------------------------------------------------------------------ topology
    @property
    def strategy(self) -> Strategy:
        """The strategy every call goes through."""
        return self._engine.strategy

    @property
    def accelerator(self) -> Any:
        """The accelerator the strategy runs on."""
        return getattr(self._engine.strategy, "accelerator", None)

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._engine.device

    @property
    def global_rank(self) -> int:
        """This process's rank in the job."""
        return self._engine.process_index

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine."""
        return self._engine.local_process_index

    @property
    def node_rank(self) -> int:
        """This machine's index in the job."""
        return int(getattr(self._engine.strategy, "node_rank", 0))

    @property
    def world_size(self) -> int:
        """Processes in the job."""
        return self._engine.num_processes

    @property
    def is_global_zero(self) -> bool:
        """True on global rank 0."""
        return self._engine.is_main_process

    @property
    def loggers(self) -> list[Logger]:
        """The loggers given as ``loggers=``."""
        return self._loggers

    @property
    def logger(self) -> Optional[Logger]:
        """The first logger, or None without any."""
        return self._loggers[0] if self._loggers else None

    # ------------------------------------------------------------------ launching
    def launch(self, function: Optional[Callable[..., Any]] = None, *args: Any, **kwargs: Any) -> Any:
        """Without ``function``: mark the script as launched (the ranks already run). With it: run
        ``function(fabric, *args, **kwargs)`` on every rank (starting them under a spawn strategy) and return
        its result (global rank 0's under spawn)."""
        if function is None:
            if not self._engine._ready:
                raise ConfigurationError(
                    f"strategy={self.strategy.strategy_name!r} starts its processes in fabric.launch(function): pass "
                    "the function that trains, fabric.launch(train), and call fabric.setup inside it."
                )
            self._launched = True
            return None
        if not callable(function):
            raise ConfigurationError(f"fabric.launch(function, *args) needs a function to run on every rank; got "
                                     f"{function!r}.")  # fmt: skip
        self._launched = True
        return self._engine.launch(_run_with_fabric, self, function, args, kwargs)

    def _check_ready(self, what: str) -> None:
        if not self._engine._ready:
            raise ConfigurationError(
                f"fabric.{what} runs inside the job, but strategy={self.strategy.strategy_name!r} starts its "
                "processes in fabric.launch(function): call it inside function(fabric, ...)."
            )

    # ------------------------------------------------------------------ setting up
    def _prepared_module(self, obj: Any) -> Optional[nn.Module]:
        """The user's module behind ``obj`` when ``obj`` was set up by this Fabric, else None."""
        if isinstance(obj, FabricModule):
            obj = obj._forward_module
        for module, runner, _ in self._engine._modules:
            if obj is runner or obj is module or getattr(obj, "_orig_mod", None) is runner:
                return module
        return None

    def setup(self, module: nn.Module, *optimizers: Optimizer, scheduler: Any = None, move_to_device: bool = True,
              _reapply_compile: bool = True) -> Any:  # fmt: skip
        """Set up ``module`` (precision, device, strategy wrapper) and ``optimizers`` (and an LR ``scheduler``);
        returns ``module`` alone, or ``(module, *optimizers[, scheduler])``. Where the strategy wraps the module
        (DDP) the returned one is a :class:`~trainer.fabric.wrappers.FabricModule`: calls go through the wrapper,
        attributes, methods and the state dict are your module's (``.module`` is yours)."""
        self._check_ready("setup()")
        self._check_module(module, "setup")
        for optimizer in optimizers:
            self._check_optimizer(optimizer, "setup")
        self._check_move(move_to_device, "setup")
        extra = [] if scheduler is None else [scheduler]
        prepared = self._engine.prepare(module, *optimizers, *extra)
        if not optimizers and not extra:
            return self._wrap(prepared)
        return (self._wrap(prepared[0]), *prepared[1:])

    def setup_module(self, module: nn.Module, move_to_device: bool = True, _reapply_compile: bool = True) -> nn.Module:
        """Set up ``module`` alone (then :meth:`setup_optimizers` with optimizers built from its parameters, as
        sharded strategies need)."""
        self._check_ready("setup_module()")
        self._check_module(module, "setup_module")
        self._check_move(move_to_device, "setup_module")
        return self._wrap(self._engine.prepare(module))

    def _wrap(self, runner: nn.Module) -> nn.Module:
        """The module the strategy runs, or a :class:`FabricModule` when it is a wrapper around the user's module."""
        module = self._prepared_module(runner)
        return runner if module is None or module is runner else FabricModule(runner, module)

    def setup_optimizers(self, *optimizers: Optimizer) -> Any:
        """Set up ``optimizers``; returns one optimizer, or a tuple of them."""
        self._check_ready("setup_optimizers()")
        if not optimizers:
            raise ConfigurationError("fabric.setup_optimizers() needs at least one optimizer.")
        for optimizer in optimizers:
            self._check_optimizer(optimizer, "setup_optimizers")
        return self._engine.prepare(*optimizers)

    def setup_dataloaders(self, *dataloaders: DataLoader, use_distributed_sampler: bool = True,
                          move_to_device: bool = True) -> Any:  # fmt: skip
        """Split each dataloader across the ranks (a ``DistributedSampler``, shuffling as the loader did) and move
        its batches to the device; returns one loader, or a list of them."""
        self._check_ready("setup_dataloaders()")
        if not dataloaders:
            raise ConfigurationError("`setup_dataloaders` requires at least one dataloader.")
        self._check_move(move_to_device, "setup_dataloaders")
        prepared = []
        for loader in dataloaders:
            if isinstance(loader, EngineDataLoader):
                raise ConfigurationError("A dataloader should be passed only once to the `setup_dataloaders` method.")
            if not isinstance(loader, DataLoader):
                raise ConfigurationError(f"fabric.setup_dataloaders() takes torch DataLoaders; got "
                                         f"{type(loader).__name__}.")  # fmt: skip
            engine = self._engine
            engine.use_distributed_sampler, before = bool(use_distributed_sampler), engine.use_distributed_sampler
            try:
                prepared.append(engine.prepare_data_loader(loader))
            finally:
                engine.use_distributed_sampler = before
        return prepared[0] if len(prepared) == 1 else prepared

    def _check_module(self, module: Any, method: str) -> None:
        if self._prepared_module(module) is not None:
            raise ConfigurationError(f"A model should be passed only once to the `{method}` method.")
        if not isinstance(module, nn.Module):
            raise ConfigurationError(f"fabric.{method}() takes a torch.nn.Module first; got {type(module).__name__}.")

    @staticmethod
    def _check_optimizer(optimizer: Any, method: str) -> None:
        if isinstance(optimizer, EngineOptimizer):
            raise ConfigurationError(f"An optimizer should be passed only once to the `{method}` method.")
        if not isinstance(optimizer, Optimizer):
            raise ConfigurationError(f"fabric.{method}() takes torch.optim.Optimizer objects after the module; got "
                                     f"{type(optimizer).__name__}.")  # fmt: skip

    @staticmethod
    def _check_move(move_to_device: bool, method: str) -> None:
        if not move_to_device:
            raise ConfigurationError(
                f"fabric.{method}(move_to_device=False) is not supported: set-up modules and batches are always put "
                "on fabric.device. Leave move_to_device out (or build the module inside fabric.init_module())."
            )

    def init_module(self, empty_init: Optional[bool] = None) -> ContextManager:
        """Build modules inside this block directly on the device in the precision's dtype (``empty_init=True``
        skips random initialisation when weights are loaded next)."""
        self._check_ready("init_module()")
        return self.strategy.module_init_context(empty_init)

    def init_tensor(self) -> ContextManager:
        """Create tensors inside this block on the device in the precision's dtype."""
        return self.init_module(empty_init=False)

    # ------------------------------------------------------------------ the step
    def backward(self, tensor: Tensor, *args: Any, model: Optional[nn.Module] = None, **kwargs: Any) -> None:
        """``tensor.backward(*args, **kwargs)`` through the strategy (scaled under 16-mixed). The loss is not
        divided: under accumulation divide it yourself, as with Fabric."""
        if not self._engine._modules:
            raise ConfigurationError("fabric.backward() was called before any model was set up. Call "
                                     "model, optimizer = fabric.setup(model, optimizer) first and compute the loss "
                                     "with the model setup returned.")  # fmt: skip
        if len(args) > len(_BACKWARD_ARGUMENTS):
            raise ConfigurationError(f"fabric.backward() got {len(args)} positional arguments after the tensor; "
                                     f"Tensor.backward takes {_BACKWARD_ARGUMENTS}.")  # fmt: skip
        kwargs.update(zip(_BACKWARD_ARGUMENTS, args))
        self._engine.backward(tensor, **kwargs)

    def clip_gradients(self, module: nn.Module, optimizer: Optimizer, clip_val: Optional[float] = None,
                       max_norm: Optional[float] = None, norm_type: float = 2.0,
                       error_if_nonfinite: bool = True) -> Optional[Tensor]:  # fmt: skip
        """Clip ``module``'s gradients to total norm ``max_norm`` (returns the norm before clipping) or to
        ``[-clip_val, clip_val]``, unscaling them first under 16-mixed."""
        if clip_val is not None and max_norm is not None:
            raise ConfigurationError("Only one of `clip_val` or `max_norm` can be set as this specifies the underlying "
                                     "clipping algorithm! Pass clip_val to clamp each gradient, max_norm to scale "
                                     "them to a total norm.")  # fmt: skip
        if clip_val is None and max_norm is None:
            raise ConfigurationError("You have to specify either `clip_val` or `max_norm` to do gradient clipping! "
                                     "e.g. fabric.clip_gradients(model, optimizer, max_norm=1.0).")  # fmt: skip
        if self._prepared_module(module) is None:
            raise ConfigurationError("fabric.clip_gradients() needs the model fabric.setup returned: "
                                     "model, optimizer = fabric.setup(model, optimizer).")  # fmt: skip
        if clip_val is not None:
            self._engine.clip_grad_value_(module.parameters(), clip_val)
            return None
        norm = self._engine.clip_grad_norm_(module.parameters(), max_norm, norm_type)
        if error_if_nonfinite and norm is not None and not torch.isfinite(norm).all():
            raise RuntimeError(
                f"The total norm of order {float(norm_type)} for gradients from `parameters` is non-finite, so it "
                "cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, "
                "set `error_if_nonfinite=False`."
            )
        return norm

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> ContextManager:
        """Skip the gradient synchronisation of ``module``'s backward passes inside this block (accumulating
        micro-batches); ``enabled=False`` synchronises as usual."""
        if self._prepared_module(module) is None:
            raise ConfigurationError("You need to set up the model first before you can call `fabric.no_backward_sync()`"
                                     ": model = fabric.setup(model, ...).")  # fmt: skip
        if not enabled:
            return contextlib.nullcontext()
        return self._engine.no_sync(module._forward_module if isinstance(module, FabricModule) else module)

    def autocast(self) -> ContextManager:
        """The precision's forward context (autocast under mixed precision), for code outside a set-up module."""
        return self._engine.autocast()

    def to_device(self, obj: Any) -> Any:
        """Move a module, tensor or nested collection of tensors to :attr:`device`."""
        if isinstance(obj, nn.Module):
            return obj.to(self.device)
        return self._engine.to_device(obj)

    # ------------------------------------------------------------------ collectives
    def barrier(self, name: Optional[str] = None) -> None:
        """Wait until every process reaches this point."""
        self.strategy.barrier(name)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """``obj`` (any picklable value) as rank ``src`` has it. Every rank must call it."""
        return self.strategy.broadcast(obj, src)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Every rank's tensors (numbers become tensors) stacked along a new first dimension of size
        ``world_size``; nested collections keep their structure. One process gets ``data`` back unchanged."""
        self._check_group(group, "all_gather")
        if sync_grads:
            raise ConfigurationError("fabric.all_gather(sync_grads=True) is not supported: the gathered tensors carry "
                                     "no gradient. Gather detached values, or compute the loss on the local part.")  # fmt: skip
        data = _to_tensors(data, self.device, "fabric.all_gather()")
        if self.world_size == 1:
            return data
        from trainer.engine.engine import _apply_to_tensors

        return _apply_to_tensors(data, self.strategy.all_gather)

    def all_reduce(self, data: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Tensors (numbers become tensors) reduced over ranks with ``reduce_op`` ("mean", "sum", "max", "min"
        or a ``torch.distributed.ReduceOp`` of those)."""
        self._check_group(group, "all_reduce")
        name = str(getattr(reduce_op, "name", reduce_op)).lower()
        if name not in _REDUCE_OPS:
            raise ConfigurationError(f"fabric.all_reduce(reduce_op={reduce_op!r}) is not supported. Use one of "
                                     f"{sorted(set(_REDUCE_OPS))}.")  # fmt: skip
        data = _to_tensors(data, self.device, "fabric.all_reduce()")
        from trainer.engine.engine import _apply_to_tensors

        return _apply_to_tensors(data, lambda tensor: self.strategy.reduce(tensor, _REDUCE_OPS[name]))

    @staticmethod
    def _check_group(group: Any, method: str) -> None:
        if group is not None:
            raise ConfigurationError(f"fabric.{method}(group=...) is not supported: collectives run over every "
                                     "process. Leave group out.")  # fmt: skip

    @contextlib.contextmanager
    def rank_zero_first(self, local: bool = False) -> Iterator[None]:
        """Run the block on rank 0 first (of each machine with ``local=True``), then on the others."""
        with self._engine.local_main_process_first() if local else self._engine.main_process_first():
            yield

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on local rank 0 of each machine."""
        if self.local_rank == 0:
            print(*args, **kwargs)

    # ------------------------------------------------------------------ callbacks and logging
    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        """Call ``hook_name(*args, **kwargs)`` on every callback that has such a method, in order."""
        for callback in self._callbacks:
            method = getattr(callback, hook_name, None)
            if method is None:
                continue
            if not callable(method):
                raise ConfigurationError(f"fabric.call({hook_name!r}): {type(callback).__name__}.{hook_name} is not "
                                         "callable.")  # fmt: skip
            method(*args, **kwargs)

    def log(self, name: str, value: Any, step: Optional[int] = None) -> None:
        """Send one scalar (a number or one-element tensor) to every logger, on global rank 0."""
        self.log_dict({name: value}, step=step)

    def log_dict(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        """Send scalars to every logger, on global rank 0."""
        if not self.is_global_zero or not self._loggers:
            return
        values = {key: value.item() if isinstance(value, Tensor) else value for key, value in metrics.items()}
        for logger in self._loggers:
            logger.log_metrics(values, step)

    @staticmethod
    def seed_everything(seed: Optional[int] = None, workers: Optional[bool] = None, verbose: bool = True) -> int:
        """Seed every random generator (and, with ``workers``, DataLoader workers); returns the seed."""
        return _seed_everything(seed, workers=bool(workers))

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Union[str, os.PathLike], state: dict[str, Any], filter: Optional[dict[str, Any]] = None) -> None:
        """Write ``state`` (set-up modules and optimizers become their state dicts, objects with ``state_dict()``
        theirs, other values stay) to the file ``path``; global rank 0 writes. Under FSDP (``state_dict_type=
        "sharded"``) ``path`` becomes a sharded folder, each rank writing its shards, as Lightning's Fabric;
        with ``state_dict_type="full"`` the state dicts are gathered into one file. Every rank must call it."""
        if filter is not None:
            raise ConfigurationError("fabric.save(filter=...) is not supported; save a dict holding only what you "
                                     "want, e.g. {'model': model.state_dict()}.")  # fmt: skip
        if getattr(self.strategy, "state_dict_type", None) == "sharded" and isinstance(path, (str, os.PathLike)):
            converted = state_of(state, self._prepared_module, self.strategy)
            sharded = sharded_entries(converted)
            if sharded:
                return save_sharded_state(self.strategy, path, converted, sharded)
        with whole_state_dicts(self.strategy):
            save_state(self.strategy, path, state_of(state, self._prepared_module, self.strategy))

    def load(self, path: Union[str, os.PathLike], state: Optional[dict[str, Any]] = None,
             strict: bool = True) -> dict[str, Any]:  # fmt: skip
        """Restore :meth:`save`'s file into ``state`` (modules, optimizers and stateful objects in place, other
        values replaced in the dict) and return what the file holds beyond it; without ``state`` return the
        whole file."""
        with whole_state_dicts(self.strategy):
            return load_state(self.strategy, path, state, strict, self._prepared_module)

    def load_raw(self, path: Union[str, os.PathLike], obj: Union[nn.Module, Optimizer], strict: bool = True) -> None:
        """Load a plain state dict file (``torch.save(model.state_dict(), path)``) into one module or optimizer."""
        with whole_state_dicts(self.strategy):
            load_state(self.strategy, path, {"_raw": obj}, strict, self._prepared_module, raw=True)

    def __repr__(self) -> str:
        return f"Fabric(strategy={self.strategy!r}, world_size={self.world_size})"
