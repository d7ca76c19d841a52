"""``Engine``: the Trainer's strategies, precision plugins, data splitting and checkpoint IO for a loop you write
yourself (the API of Hugging Face Accelerate's ``Accelerator``)::

    engine = Engine(devices=2, precision="16-mixed", accumulate_grad_batches=2)
    model, optimizer, loader = engine.prepare(model, optimizer, loader)
    for x, y in loader:                                 # this rank's share, already on engine.device
        with engine.accumulate(model):                  # no gradient all-reduce inside a window
            loss = loss_fn(model(x), y)                 # forward autocast under mixed precision
            engine.backward(loss)                       # divided by accumulate_grad_batches, scaled under fp16
            engine.clip_grad_norm_(model.parameters(), 1.0)   # unscales first; a no-op inside a window
            optimizer.step()                            # a no-op inside a window
            optimizer.zero_grad()

Nothing here is strategy- or precision-specific: every step goes through the same ``Strategy`` the Trainer
drives (``setup_module``, ``backward_sync``, ``backward``, ``optimizer_step``, ``clip_parameters``, collectives).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Union

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import DataLoader

from trainer.loggers.logger import Logger
from trainer.strategies.checkpoint.checkpoint_io import atomic_save
from trainer.strategies.speed.compile import check_compile
from trainer.strategies.connector import build_strategy
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.strategy import Strategy
from trainer.config.arguments import check_accumulate_grad_batches
from trainer.data.loaders import prepare_loader
from trainer.engine.wrappers import (
    AccumulationWindow, AutocastForward, EngineDataLoader, EngineOptimizer, EngineScheduler, LoaderState,
    skip_first_batches,
)
from trainer.config.launch_defaults import launch_aliases, with_launch_defaults
from trainer.engine.accelerate_arguments import AccelerateArguments
from trainer.engine.accelerate_arguments import distributed_type
from trainer.engine.options import (
    ACCELERATE_PRECISION, AutocastKwargs, DataLoaderConfiguration, DistributedType, GradientAccumulationPlugin, KwargsHandler,
    ProfileKwargs, ProjectConfiguration,
)
from trainer.engine.trackers import NoOpTracker, Tracker, check_trackers, create_trackers

_NULL_CONTEXT = contextlib.nullcontext()
_REDUCTIONS = ("sum", "mean", "max", "min", "none")


def _run_in_rank(engine: "Engine", fn: Callable[..., Any], args: tuple) -> Any:
    """Entry point of a rank that ``Engine.launch`` started: join the job, then run the user's function."""
    engine._setup()
    return fn(engine, *args)


def _apply_to_tensors(data: Any, fn: Callable[[Tensor], Any]) -> Any:
    if isinstance(data, Tensor):
        return fn(data)
    if isinstance(data, dict):
        return type(data)((k, _apply_to_tensors(v, fn)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(_apply_to_tensors(v, fn) for v in data)
    raise ConfigurationError(f"Expected tensors (or dicts/lists/tuples of tensors), got {type(data).__name__}.")


class Engine:
    """Distributed training, mixed precision and gradient accumulation for a hand-written loop.

    Takes the Trainer's ``accelerator``/``devices``/``num_nodes``/``strategy``/``precision`` and
    ``accumulate_grad_batches`` (validated identically). ``loggers``: True (TensorBoard, else CSV), "tensorboard",
    "csv", a ``trainer.loggers.Logger`` or a list; named ones are created by :meth:`init_trackers` under ``project_dir``.

    On return the job is running: from a plain ``python script.py`` with several devices the other ranks have
    been started (they re-run the script, as with the Trainer), under torchrun/SLURM/``trainer run`` this process
    has joined. A spawn strategy (``"ddp_spawn"``, ``DDPStrategy(start_method="fork")`` in a notebook) starts its
    ranks in :meth:`launch` instead. Under ``trainer run``/``trainer slurm`` the launcher's settings (its config
    file, Accelerate's included, and ``--trainer.*``) fill the arguments the script leaves out.

    The keyword-only arguments are Accelerate's ``Accelerator`` arguments, read into the ones above
    (:mod:`trainer.engine.accelerate_arguments`): ``mixed_precision`` ("no", "fp16", "bf16"; None leaves
    ``precision``), ``cpu``, ``gradient_accumulation_steps``/``gradient_accumulation_plugin``, ``log_with``,
    ``project_config``, ``kwargs_handlers``, ``dataloader_config``/``split_batches`` (Accelerate's split: only
    with :class:`trainer.accelerate.Accelerator`), ``step_scheduler_with_optimizer`` (False: a prepared scheduler
    steps at every call), ``device_placement`` and ``rng_types`` (their defaults only).
    """

    #: Whose numbers prepared dataloaders, schedulers and gathers give: "trainer" (the Trainer's split and one
    #: scheduler step per optimizer step) or "accelerate" (:class:`trainer.accelerate.Accelerator`).
    numbers = "trainer"

    @with_launch_defaults
    @launch_aliases(mixed_precision=("precision", None), cpu=("accelerator", None, False),
                    gradient_accumulation_steps=("accumulate_grad_batches", None, 1))
    def __init__(
        self,
        accelerator: str = "auto",
        devices: Union[str, int, list[int]] = "auto",
        num_nodes: int = 1,
        strategy: Union[str, Strategy] = "auto",
        precision: Union[str, int] = "32-true",
        accumulate_grad_batches: int = 1,
        loggers: Union[bool, str, Logger, Iterable[Union[str, Logger]], None] = None,
        project_dir: Optional[Union[str, os.PathLike]] = None,
        use_distributed_sampler: bool = True,
        *,
        mixed_precision: Optional[str] = None,
        cpu: bool = False,
        gradient_accumulation_steps: Optional[int] = None,
        log_with: Any = None,
        project_config: Optional[ProjectConfiguration] = None,
        kwargs_handlers: Optional[Iterable[KwargsHandler]] = None,
        dataloader_config: Optional[DataLoaderConfiguration] = None,
        split_batches: Optional[bool] = None,
        step_scheduler_with_optimizer: bool = True,
        gradient_accumulation_plugin: Optional[GradientAccumulationPlugin] = None,
        device_placement: bool = True,
        rng_types: Optional[list[str]] = None,
        sample_seeds: bool = True,
    ) -> None:
        compat = AccelerateArguments.read(
            self, accelerator=accelerator, precision=precision, accumulate_grad_batches=accumulate_grad_batches,
            loggers=loggers, project_dir=project_dir, mixed_precision=mixed_precision, cpu=cpu,
            gradient_accumulation_steps=gradient_accumulation_steps, log_with=log_with, project_config=project_config,
            kwargs_handlers=kwargs_handlers, dataloader_config=dataloader_config, split_batches=split_batches,
            gradient_accumulation_plugin=gradient_accumulation_plugin, device_placement=device_placement,
            rng_types=rng_types,
        )  # fmt: skip
        self._compat = compat
        accumulate = check_accumulate_grad_batches(compat.accumulate_grad_batches)
        self._tracker_specs = check_trackers(compat.loggers)
        project_dir = compat.project_dir
        if project_dir is not None and not isinstance(project_dir, (str, os.PathLike)):
            raise ConfigurationError(f"project_dir={project_dir!r} must be a path (str or os.PathLike) or None.")
        self.project_dir = str(project_dir) if project_dir is not None else os.getcwd()
        self.project_configuration = compat.project_config
        self.project_configuration.set_directories(self.project_dir)
        self.use_distributed_sampler = bool(use_distributed_sampler)
        #: Seed each sample's generators in the workers of prepared loaders from (run seed, epoch, index).
        self.sample_seeds = bool(sample_seeds)
        self.step_scheduler_with_optimizer = bool(step_scheduler_with_optimizer)
        self.strategy: Strategy = build_strategy(compat.accelerator, devices, num_nodes, strategy, compat.precision)
        if not self.strategy.runs_forward:
            raise ConfigurationError(
                f"strategy={self.strategy.strategy_name!r} runs the module's training_step on every device, which a "
                "hand-written loop does not have. Use strategy='ddp' (one process per device) with the Engine."
            )
        compat.apply_before_launch(self.strategy)
        self._window = AccumulationWindow(accumulate)
        self._loader_state = LoaderState()  # set by prepared loaders, read by gather_for_metrics
        self._autocast = AutocastForward(self.strategy.precision)
        self._modules: list[tuple[nn.Module, nn.Module, list[Any]]] = []  # (module, runner, autocast hooks)
        self._optimizers: list[EngineOptimizer] = []
        self._schedulers: list[EngineScheduler] = []
        self._loaders: list[EngineDataLoader] = []
        self._custom: list[Any] = []
        self._param_owner: dict[int, EngineOptimizer] = {}
        self._trigger = False
        self.loggers: list[Logger] = []
        self._trackers: list[Tracker] = []
        self._ready: Optional[bool] = None  # None: the job was not joined yet; False: joining failed
        launcher = self.strategy.launcher
        if launcher is None:
            self._setup()
        elif launcher.runs_in_caller:
            try:
                launcher.launch(self._setup)
            except ConfigurationError as err:
                if self._ready is not None:
                    raise
                # Starting the other ranks failed: this program cannot be re-run (a notebook, python -c).
                raise ConfigurationError(
                    f"{err} In a notebook, use Engine(strategy=DDPStrategy(start_method='fork'), ...) and start the "
                    "ranks with engine.launch(fn)."
                ) from None

    def _setup(self) -> None:
        self._ready = False
        self.strategy.setup_environment()
        self._compat.apply_after_setup(self.strategy)
        self._ready = True

    # ------------------------------------------------------------------ launching
    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(engine, *args)`` on every rank and return its result.

        With a spawn strategy this starts the ranks (from a notebook: ``DDPStrategy(start_method="fork")``;
        ``fn`` and ``args`` are sent to them, so they must be picklable under "spawn") and returns global rank
        0's result to the caller. Otherwise the ranks already run and ``fn`` is simply called in each of them.
        """
        if not callable(fn):
            raise ConfigurationError(f"launch(fn, *args) needs a function to run on every rank; got {fn!r}.")
        launcher = self.strategy.launcher
        if self._ready:
            if launcher is not None and launcher.runs_in_caller:
                return launcher.launch(fn, self, *args)  # a failure here stops the ranks this process started
            return fn(self, *args)
        return launcher.launch(_run_in_rank, self, fn, args)

    def _require_ready(self, what: str) -> None:
        if not self._ready:
            raise ConfigurationError(
                f"{what} runs inside the job, but strategy={self.strategy.strategy_name!r} starts its processes in "
                "engine.launch(fn): call it inside fn(engine, ...)."
            )

    # ------------------------------------------------------------------ topology
    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.strategy.root_device

    @property
    def num_processes(self) -> int:
        """Processes in the job."""
        return self.strategy.world_size

    @property
    def process_index(self) -> int:
        """This process's rank in the job (global rank)."""
        return self.strategy.global_rank

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine."""
        return self.strategy.local_rank

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0 (the one that writes logs and files)."""
        return self.strategy.global_rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on local rank 0 of each machine."""
        return self.strategy.local_rank == 0

    @property
    def precision(self) -> str:
        """The precision's canonical name (``"32-true"``, ``"16-mixed"``, ...)."""
        return self.strategy.precision.name

    @property
    def mixed_precision(self) -> str:
        """The precision as Accelerate names it: ``"no"`` (fp32), ``"fp16"`` or ``"bf16"``."""
        return ACCELERATE_PRECISION.get(self.strategy.precision.name, "no")

    @property
    def distributed_type(self) -> DistributedType:
        """How the job runs, as Accelerate's ``DistributedType`` (``NO`` for one process, ``MULTI_CPU``, ...)."""
        return distributed_type(self.strategy)

    @property
    def use_distributed(self) -> bool:
        """True when the job has more than one process."""
        return self.strategy.world_size > 1

    @property
    def is_last_process(self) -> bool:
        """True on the highest global rank."""
        return self.strategy.global_rank == self.strategy.world_size - 1

    @property
    def multi_device(self) -> bool:
        """True when the job has more than one process (Accelerate's name)."""
        return self.use_distributed

    @property
    def logging_dir(self) -> str:
        """The trackers' folder (``ProjectConfiguration.logging_dir``, else ``project_dir``)."""
        return str(self.project_configuration.logging_dir or self.project_dir)

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named ``save_state()`` folder gets."""
        return self.project_configuration.iteration

    @property
    def non_blocking(self) -> bool:
        """``DataLoaderConfiguration.non_blocking`` (host-to-device copies are asynchronous on CUDA anyway)."""
        return self._compat.dataloader_config.non_blocking

    @property
    def dispatch_batches(self) -> bool:
        """Always False: every process reads its own share."""
        return False

    @property
    def use_seedable_sampler(self) -> bool:
        """Always False: shuffled loaders share their sampler's generator across processes."""
        return False

    @property
    def use_stateful_dataloader(self) -> bool:
        """``DataLoaderConfiguration.use_stateful_dataloader``: prepared loaders resume exactly either way."""
        return self._compat.dataloader_config.use_stateful_dataloader

    @property
    def split_batches(self) -> bool:
        """True when prepared dataloaders cut each batch into one piece per process (Accelerator only)."""
        return self._compat.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        """True when prepared dataloaders repeat samples so every process runs equally many batches."""
        return self._compat.dataloader_config.even_batches

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (``accumulate_grad_batches``); assignable between windows."""
        return self._window.size

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        size = check_accumulate_grad_batches(steps)
        if self._window.position:
            raise ConfigurationError(
                f"gradient_accumulation_steps cannot change inside an accumulation window ({self._window.position} "
                "micro-batches into it); set it when a window has ended (engine.sync_gradients is True)."
            )
        self._window.size = size

    @property
    def sync_gradients(self) -> bool:
        """True when the current micro-batch ends its accumulation window: gradients are all-reduced and
        prepared optimizers step. Set by :meth:`accumulate`; True outside it."""
        return self._window.sync

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when a prepared optimizer's last step was skipped (16-mixed: inf/nan gradients)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    # ------------------------------------------------------------------ preparing
    def prepare(self, *objects: Any, compile: Union[bool, dict[str, Any], None] = None,
                device_placement: Optional[list[bool]] = None) -> Any:
        """Prepare modules, optimizers, dataloaders and LR schedulers; returns them in the order given (one
        object when one was given).

        Modules are converted for the precision, moved to the device and wrapped (e.g. DDP); dataloaders are
        split across ranks as the Trainer splits training data; optimizers and schedulers follow the
        accumulation window. Modules are set up before the optimizers whatever the order.

        ``compile``: ``True`` or a dict of ``torch.compile`` options (``mode``, ``dynamic``, ``fullgraph``,
        ``backend``, ``options``) compiles each module's forward after wrapping, as the Trainer's ``compile=``
        does (:mod:`trainer.strategies.speed.compile`): in place, so the returned object and its state-dict keys are unchanged.
        """
        if not objects:
            raise ConfigurationError("prepare() needs at least one module, optimizer, dataloader or LR scheduler.")
        if device_placement is not None and not all(device_placement):
            raise ConfigurationError("prepare(device_placement=[..., False, ...]) is not supported: prepared modules and "
                                     "batches are always put on engine.device. Leave device_placement out.")  # fmt: skip
        self._require_ready("prepare()")
        compile_options = check_compile(compile, "prepare(compile=...)")
        kinds = [self._kind(obj, index) for index, obj in enumerate(objects)]
        results = list(objects)
        for index, obj in enumerate(objects):
            if kinds[index] == "module":
                results[index] = self._prepare_module(obj, compile_options)
        for index, obj in enumerate(objects):
            if kinds[index] == "loader":
                results[index] = self._prepare_loader(obj, training=True)
        optimizers = [index for index, kind in enumerate(kinds) if kind == "optimizer"]
        if optimizers:
            prepared = self.strategy.setup_optimizers([objects[index] for index in optimizers])
            for index, optimizer in zip(optimizers, prepared):
                results[index] = self._wrap_optimizer(optimizer)
        for index, obj in enumerate(objects):
            if kinds[index] == "scheduler":
                results[index] = self._prepare_scheduler(obj)
        return results[0] if len(results) == 1 else tuple(results)

    def prepare_data_loader(self, loader: DataLoader, evaluation: bool = False) -> EngineDataLoader:
        """Prepare one dataloader. ``evaluation=True``: every sample exactly once across ranks (no padding, so
        ranks may get one batch fewer), and the loader neither ends accumulation windows nor is saved in state."""
        self._require_ready("prepare_data_loader()")
        if self._kind(loader, 0) != "loader":
            raise ConfigurationError(f"prepare_data_loader() takes a torch DataLoader, got {type(loader).__name__}.")
        return self._prepare_loader(loader, training=not evaluation)

    def _kind(self, obj: Any, index: int) -> str:
        if isinstance(obj, (EngineOptimizer, EngineScheduler, EngineDataLoader)) or any(
            obj is runner for _, runner, _ in self._modules
        ):
            return "prepared"
        if isinstance(obj, nn.Module):
            return "module"
        if isinstance(obj, Optimizer):
            return "optimizer"
        if isinstance(obj, DataLoader):
            return "loader"
        if isinstance(obj, (LRScheduler, ReduceLROnPlateau)):
            return "scheduler"
        raise ConfigurationError(
            f"prepare() got a {type(obj).__name__} (argument {index}), which it does not know how to prepare. It takes "
            "torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader and torch.optim.lr_scheduler "
            "objects; use anything else as it is (move batches of another iterable with engine.to_device(batch))."
        )

    def _prepare_module(self, module: nn.Module, compile_options: Optional[dict[str, Any]] = None) -> nn.Module:
        runner = self.strategy.setup_module(module)
        self._compat.register_comm_hook(runner)
        module = self.strategy.module if self.strategy.module is not None else module
        if compile_options is not None:
            self.strategy.compile_module(module, compile_options)
        hooks = self._autocast.attach(module) if AutocastForward.needed(self.strategy.precision) else []
        self._modules.append((module, runner, hooks))
        return runner

    def _prepare_loader(self, loader: DataLoader, training: bool) -> EngineDataLoader:
        cuda = self.strategy.root_device.type == "cuda"
        if self.numbers == "accelerate":
            split = self._deal(loader, training, cuda)
        else:
            split = prepare_loader(loader, self.strategy.distributed_sampler_kwargs, training,
                                   self.use_distributed_sampler, cuda)  # fmt: skip
        prepared = EngineDataLoader(split, self.strategy, self._window if training else None, self._loader_state,
                                    accelerate_numbers=self.numbers == "accelerate",
                                    sample_seeds=self.sample_seeds)  # fmt: skip
        self._loaders.append(prepared)
        return prepared

    def _deal(self, loader: DataLoader, training: bool, cuda: bool) -> Any:
        """Accelerate's split: whole batches dealt in turn (or cut, ``split_batches``), evaluation loaders too."""
        from trainer.data.batch_shard import deal_batches
        from torch.utils.data import DistributedSampler

        if cuda and not loader.pin_memory:
            loader.pin_memory = True
        kwargs = self.strategy.distributed_sampler_kwargs
        if not self.use_distributed_sampler or kwargs is None or isinstance(loader.sampler, DistributedSampler):
            return loader
        config = self._compat.dataloader_config
        return deal_batches(loader, kwargs["num_replicas"], kwargs["rank"], config.split_batches, config.even_batches)

    def _wrap_optimizer(self, optimizer: Optimizer) -> EngineOptimizer:
        if optimizer.state:  # state loaded before prepare: put it next to the parameters (and in their dtype)
            optimizer.load_state_dict(optimizer.state_dict())
        wrapped = EngineOptimizer(optimizer, self.strategy, self._window)
        for group in optimizer.param_groups:
            for param in group["params"]:
                self._param_owner[id(param)] = wrapped
        self._optimizers.append(wrapped)
        return wrapped

    def _prepare_scheduler(self, scheduler: Any) -> EngineScheduler:
        target = scheduler.optimizer
        owner = target if isinstance(target, EngineOptimizer) else next(
            (opt for opt in self._optimizers if opt.optimizer is target), None
        )
        if owner is None:
            raise ConfigurationError(
                f"prepare() got a {type(scheduler).__name__} whose optimizer has not been prepared. Prepare the "
                "optimizer first, or in the same call: engine.prepare(model, optimizer, scheduler)."
            )
        steps = self.num_processes if self.numbers == "accelerate" and not self.split_batches else 1
        prepared = EngineScheduler(scheduler, owner, self._window, steps, self.step_scheduler_with_optimizer)
        self._schedulers.append(prepared)
        return prepared

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True) -> nn.Module:
        """The user's module behind a prepared one (without DDP or ``torch.compile`` wrappers).

        ``keep_fp32_wrapper=False`` also removes the autocast hooks ``prepare`` put on it under mixed precision.
        """
        model = getattr(model, "_orig_mod", model)  # torch.compile
        for module, runner, hooks in self._modules:
            if model is runner or model is module:
                if not keep_fp32_wrapper:
                    for handle in hooks:
                        handle.remove()
                    hooks.clear()
                return module
        return model

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """``dataloader`` starting ``num_batches`` batches in; a prepared dataloader ``load_state`` has just
        positioned is returned as it is (it continues at the saved batch already)."""
        return skip_first_batches(dataloader, num_batches)

    def prepare_model(self, model: nn.Module, device_placement: Optional[bool] = None,
                      evaluation_mode: bool = False) -> nn.Module:  # fmt: skip
        """``prepare(model)``; ``evaluation_mode=True`` only moves and converts it (no DDP wrapper)."""
        if evaluation_mode:
            self._require_ready("prepare_model()")
            return self.strategy.precision.convert_module(model).to(self.device)
        return self.prepare(model)

    def prepare_optimizer(self, optimizer: Optimizer, device_placement: Optional[bool] = None) -> EngineOptimizer:
        """``prepare(optimizer)``."""
        return self.prepare(optimizer)

    def prepare_scheduler(self, scheduler: Any) -> EngineScheduler:
        """``prepare(scheduler)``."""
        return self.prepare(scheduler)

    def unscale_gradients(self, optimizer: Optional[Any] = None) -> None:
        """Unscale the gradients of ``optimizer`` (or of every prepared optimizer) under fp16; a no-op otherwise
        and when already unscaled this step."""
        targets = self._optimizers if optimizer is None else [optimizer]
        for target in targets:
            self.strategy.unscale_gradients(getattr(target, "optimizer", target))

    def save_model(self, model: nn.Module, save_directory: Union[str, os.PathLike], max_shard_size: Any = None,
                   safe_serialization: bool = True) -> None:  # fmt: skip
        """Write the prepared ``model``'s full state dict to ``save_directory`` on rank 0:
        ``model.safetensors`` (needs the safetensors package) or, with ``safe_serialization=False``,
        ``pytorch_model.bin``. One file, whatever ``max_shard_size`` says."""
        state = self.get_state_dict(model)
        folder = Path(save_directory)
        if self.is_main_process:
            folder.mkdir(parents=True, exist_ok=True)
            if safe_serialization:
                try:
                    from safetensors.torch import save_file
                except ImportError:
                    raise ConfigurationError("save_model(safe_serialization=True) needs the safetensors package: "
                                             "install it, or pass safe_serialization=False.") from None  # fmt: skip
                save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
            else:
                atomic_save(state, folder / "pytorch_model.bin")
        self.wait_for_everyone()

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict of a prepared ``model`` (gathered from the ranks under sharded strategies)."""
        module = self.unwrap_model(model)
        if any(module is m for m, _, _ in self._modules):
            return self.strategy.module_state_dict(module)
        return module.state_dict()

    def to_device(self, data: Any) -> Any:
        """Move a (nested) batch to this process's device and convert it for the precision, as prepared
        dataloaders do."""
        return self.strategy.batch_to_device(data)

    # ------------------------------------------------------------------ the step
    def accumulate(self, *models: nn.Module) -> ContextManager:
        """Context for one micro-batch: counts it, sets :attr:`sync_gradients`, and inside an accumulation window
        skips the gradient all-reduce of ``models`` (DDP ``no_sync``). Windows end every
        ``accumulate_grad_batches`` micro-batches and at the last batch of a prepared training dataloader."""
        if self._window.advance() or not models:
            return _NULL_CONTEXT
        if len(models) == 1:
            return self.strategy.backward_sync(False, models[0])
        stack = contextlib.ExitStack()
        for model in models:
            stack.enter_context(self.strategy.backward_sync(False, model))
        return stack

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Skip the gradient all-reduce of ``model`` for the backward passes inside this context."""
        return self.strategy.backward_sync(False, model)

    def autocast(self, autocast_handler: Optional[AutocastKwargs] = None) -> ContextManager:
        """The precision's forward context (autocast under mixed precision), for code outside a prepared
        module's forward. ``autocast_handler=AutocastKwargs(enabled=False)`` turns autocast off inside."""
        if autocast_handler is not None and not autocast_handler.enabled:
            return torch.autocast(self.device.type, enabled=False)
        return self.strategy.precision.forward_context()

    def backward(self, loss: Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` through the strategy: divided by ``accumulate_grad_batches``, scaled under
        16-mixed. ``kwargs`` go to ``Tensor.backward`` (e.g. ``retain_graph=True``)."""
        if not self._modules:
            raise ConfigurationError(
                "engine.backward() was called before any module was prepared. Call "
                "model, optimizer, loader = engine.prepare(model, optimizer, loader) first and compute the loss "
                "with the model prepare returned."
            )
        if self._window.size > 1:
            loss = loss / self._window.size
        self.strategy.backward(loss, **kwargs)

    def clip_grad_norm_(self, parameters: Union[Tensor, Iterable[Tensor]], max_norm: float,
                        norm_type: float = 2.0) -> Optional[Tensor]:  # fmt: skip
        """Clip the gradients of ``parameters`` to total norm ``max_norm`` (unscaled first under 16-mixed);
        returns the total norm before clipping. Inside an accumulation window it does nothing and returns None:
        only a window's complete gradients are clipped."""
        return self._clip(parameters, max_norm, "norm", norm_type)

    def clip_grad_value_(self, parameters: Union[Tensor, Iterable[Tensor]], clip_value: float) -> None:
        """Clamp the gradients of ``parameters`` to ``[-clip_value, clip_value]`` (unscaled first under
        16-mixed). Inside an accumulation window it does nothing."""
        self._clip(parameters, clip_value, "value")

    def _clip(self, parameters: Any, value: float, algorithm: str, norm_type: float = 2.0) -> Optional[Tensor]:
        if not self._window.sync:
            return None
        params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
        if not any(param.grad is not None for param in params):
            raise ConfigurationError(
                f"clip_grad_{algorithm}_() found no gradients on the {len(params)} parameter(s) it was given. Call "
                "engine.backward(loss) before clipping, pass the parameters of the module that computed the loss, "
                "and clip before optimizer.zero_grad()."
            )
        owners = {id(owner): owner for param in params if (owner := self._param_owner.get(id(param))) is not None}
        for owner in owners.values():
            self.strategy.unscale_gradients(owner.optimizer)
        return self.strategy.clip_parameters(params, value, algorithm, norm_type)

    # ------------------------------------------------------------------ collectives
    def gather(self, data: Any) -> Any:
        """Every rank's tensors concatenated along the first dimension (scalars become a vector of one value per
        rank); nested dicts/lists/tuples of tensors keep their structure. Every rank must call it. (The
        Accelerator, as Accelerate, returns ``data`` unchanged in a one-process job.)"""
        if self.numbers == "accelerate" and self.num_processes == 1:
            return data
        gather = self.strategy.all_gather
        return _apply_to_tensors(data, lambda t: gather(t).flatten(0, 1) if t.dim() else gather(t))

    def gather_for_metrics(self, data: Any, use_gather_object: bool = False) -> Any:
        """:meth:`gather`, less the samples a prepared dataloader repeated to give every rank equally many
        batches: gathering a metric's inputs over a whole epoch counts each sample exactly once. Call it on the
        batch the loader just yielded (tensors whose first dimension is the batch). Every rank must call it.

        Under Accelerate's numbers (the Accelerator) it is Accelerate's: data that is not all tensors (or
        ``use_gather_object=True``) is gathered as objects (:func:`gather_object`), and on a loader's last batch
        the gathered result keeps its first ``len(dataset) % samples_per_step`` rows, whatever tensor it is."""
        if self.numbers == "accelerate":
            return self._gather_like_accelerate(data, use_gather_object)
        if use_gather_object:
            raise ConfigurationError("gather_for_metrics(use_gather_object=True) is the Accelerator's "
                                     "(trainer.accelerate); the Engine gathers tensors.")  # fmt: skip
        gather, padded = self.strategy.all_gather, self._loader_state.padded_ranks
        if not padded:
            return self.gather(data)
        first_padded = self.num_processes - padded

        def per_sample(tensor: Tensor) -> Tensor:
            if not tensor.dim():
                return gather(tensor)
            ranks = gather(tensor)
            return torch.cat([rows if rank < first_padded else rows[:-1] for rank, rows in enumerate(ranks)])

        return _apply_to_tensors(data, per_sample)

    def _gather_like_accelerate(self, data: Any, use_gather_object: bool) -> Any:
        try:
            _apply_to_tensors(data, lambda t: t)
            as_objects = use_gather_object
        except ConfigurationError:
            as_objects = True
        if as_objects:
            from trainer.engine.collectives import gather_object

            gathered = gather_object(data) if self.num_processes > 1 else data
        else:
            gathered = self.gather(data)
        remainder = self._loader_state.remainder
        if not remainder:
            return gathered
        if as_objects:
            return gathered[:remainder] if isinstance(gathered, (list, tuple)) else gathered
        return _apply_to_tensors(gathered, lambda t: t[:remainder] if t.dim() else t)

    def reduce(self, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Tensors reduced over ranks: ``"sum"`` (Accelerate's default), ``"mean"``, ``"max"``, ``"min"`` or
        ``"none"``. Every rank must call it. ``scale`` (Accelerate's, applied on TPUs only) must stay 1.0."""
        if scale != 1.0:
            raise ConfigurationError(f"reduce(scale={scale}) is not supported (Accelerate applies it on TPUs only); "
                                     "multiply the result instead.")  # fmt: skip
        if reduction not in _REDUCTIONS:
            raise ConfigurationError(f"reduce(reduction={reduction!r}) is not supported. Use one of {_REDUCTIONS}.")
        if reduction == "none":
            return data
        reduce = self.strategy.reduce
        return _apply_to_tensors(data, lambda t: reduce(t, reduction))

    def broadcast(self, obj: Any, from_process: int = 0) -> Any:
        """``obj`` (any picklable value, tensors included) as rank ``from_process`` has it. Every rank must call it."""
        return self.strategy.broadcast(obj, from_process)

    def wait_for_everyone(self) -> None:
        """Block until every rank reaches this point."""
        self.strategy.barrier("wait_for_everyone")

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on global rank 0 first, then on the others (e.g. to download or preprocess once)."""
        if not self.is_main_process:
            self.wait_for_everyone()
        yield
        if self.is_main_process:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on local rank 0 of each machine first, then on the others (e.g. to preprocess into a
        machine's local disk once)."""
        if not self.is_local_main_process:
            self.wait_for_everyone()
        yield
        if self.is_local_main_process:
            self.wait_for_everyone()

    def set_trigger(self) -> None:
        """Raise this process's flag; :meth:`check_trigger` on every process then returns True (e.g. one rank
        decides to stop early)."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """True on every process when any process called :meth:`set_trigger` since the last check (the flag is
        then lowered). Every process must call it: it is one all-reduce."""
        flag = torch.tensor(1.0 if self._trigger else 0.0, device=self.device)
        raised = self.strategy.reduce(flag, "sum") if self.use_distributed else flag
        if float(raised) >= 1:
            self._trigger = False
            return True
        return False

    def free_memory(self, *objects: Any) -> list[Any]:
        """Forget every prepared module, optimizer, scheduler and dataloader, collect garbage and empty the
        device cache, so they can be prepared again (e.g. with a smaller batch size after running out of memory).
        Returns a list of None as long as ``objects``, to assign over the caller's references."""
        import gc

        for _, _, hooks in self._modules:
            for handle in hooks:
                handle.remove()
        self._modules.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._loaders.clear()
        self._param_owner.clear()
        self.strategy.module = self.strategy.model = None
        self._window.position = 0
        self._window.sync = True
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return [None] * len(objects)

    release_memory = free_memory

    @contextlib.contextmanager
    def profile(self, profile_handler: Optional[ProfileKwargs] = None) -> Iterator[Any]:
        """Run the block under ``torch.profiler.profile`` as ``profile_handler`` (or the ``ProfileKwargs``
        given in ``kwargs_handlers``) describes; yields the profiler (call ``prof.step()`` with a schedule). With
        ``output_trace_dir`` each process writes ``profile_<rank>.json`` there at the end."""
        handler = profile_handler or self._compat.handler(ProfileKwargs) or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, f"profile_{self.process_index}.json"))
        self.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of ``inputs`` (a list, tuple, tensor, or dict of them), the first
        processes taking one more when it does not divide; ``apply_padding`` repeats the last element so every
        process gets as many (drop them after a gather). One process gets ``inputs`` unchanged."""
        from trainer.engine.collectives import split_share

        yield split_share(inputs, self.num_processes, self.process_index, apply_padding)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
        """Pad ``tensor`` (or nested tensors) along ``dim`` with ``pad_index`` to the largest size any process has,
        so they can be gathered. Every process must call it."""
        from trainer.engine.collectives import pad_to_largest

        return _apply_to_tensors(tensor, lambda t: pad_to_largest(self.strategy, t, dim, pad_index, pad_first))

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``function`` runs on global rank 0 only (elsewhere the call returns None)."""
        return self._on(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``function`` runs on local rank 0 of each machine only."""
        return self._on(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``function`` runs on the highest global rank only."""
        return self._on(function, lambda: self.is_last_process)

    def on_process(self, function: Optional[Callable[..., Any]] = None, process_index: Optional[int] = None) -> Any:
        """Decorator: ``function`` runs on global rank ``process_index`` only."""
        if function is None:
            return lambda fn: self.on_process(fn, process_index)
        return self._on(function, lambda: self.process_index == process_index)

    def on_local_process(self, function: Optional[Callable[..., Any]] = None,
                         local_process_index: Optional[int] = None) -> Any:  # fmt: skip
        """Decorator: ``function`` runs on local rank ``local_process_index`` of each machine only."""
        if function is None:
            return lambda fn: self.on_local_process(fn, local_process_index)
        return self._on(function, lambda: self.local_process_index == local_process_index)

    @staticmethod
    def _on(function: Callable[..., Any], here: Callable[[], bool]) -> Callable[..., Any]:
        import functools

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if here() else None

        return run

    def join_uneven_inputs(self, joinables: list[Any], even_batches: Optional[bool] = None) -> ContextManager:
        """``torch.distributed.algorithms.Join`` over ``joinables`` (prepared DDP models), for loops whose
        processes run different numbers of batches (``even_batches=False``). Nothing to do in one process."""
        if even_batches is not None:
            raise ConfigurationError("join_uneven_inputs(even_batches=...) is not supported: set even_batches in the "
                                     "DataLoaderConfiguration the loaders are prepared with.")  # fmt: skip
        if not self.use_distributed:
            return _NULL_CONTEXT
        from torch.distributed.algorithms import Join

        return Join(joinables)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_main_process:
            print(*args, **kwargs)

    # ------------------------------------------------------------------ files
    def save(self, obj: Any, path: Union[str, os.PathLike]) -> None:
        """``torch.save`` ``obj`` on global rank 0, atomically (readers see the old file or the new one)."""
        if self.is_main_process:
            atomic_save(obj, path)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (anything with ``state_dict``/``load_state_dict``, e.g. a step counter)
        in :meth:`save_state`/:meth:`load_state`, in the order registered."""
        for obj in objects:
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise ConfigurationError(
                    f"register_for_checkpointing() needs objects with state_dict() and load_state_dict(); a "
                    f"{type(obj).__name__} has {'neither' if not hasattr(obj, 'state_dict') else 'only one'}."
                )
            self._custom.append(obj)

    def save_state(self, output_dir: Union[str, os.PathLike, None] = None) -> Path:
        """Save everything needed to resume exactly: prepared modules, optimizers, schedulers, the gradient scaler,
        the accumulation window (with its gradients when saved inside one), every RNG, each prepared training
        dataloader's position, and registered objects. Every rank must call it; returns the folder.

        Without ``output_dir``: ``project_dir/checkpoints/checkpoint_<iteration>`` under
        ``ProjectConfiguration(automatic_checkpoint_naming=True)``, keeping the newest ``total_limit``."""
        from trainer.engine.state import save_engine_state

        self._require_ready("save_state()")
        if output_dir is not None:
            return save_engine_state(self, Path(output_dir))
        config = self.project_configuration
        if not config.automatic_checkpoint_naming:
            raise ConfigurationError("save_state() needs a folder, unless project_config=ProjectConfiguration("
                                     "automatic_checkpoint_naming=True, project_dir=...) names it.")  # fmt: skip
        folder = Path(self.project_dir) / "checkpoints"
        if self.is_main_process and config.total_limit is not None:
            kept = sorted(folder.glob("checkpoint_*"), key=lambda p: int(p.name.rpartition("_")[2]))
            import shutil

            for old in kept[: max(0, len(kept) + 1 - config.total_limit)]:
                shutil.rmtree(old)
        self.wait_for_everyone()
        saved = save_engine_state(self, folder / f"checkpoint_{config.iteration}")
        config.iteration += 1
        return saved

    def load_state(self, input_dir: Union[str, os.PathLike, None] = None) -> None:
        """Restore what :meth:`save_state` wrote into the objects prepared (in the same order) by this Engine. The
        next pass over a prepared training dataloader continues at the batch where the saved run stood. Without
        ``input_dir``: the newest automatically named checkpoint."""
        from trainer.engine.state import load_engine_state

        self._require_ready("load_state()")
        if input_dir is None:
            found = sorted((Path(self.project_dir) / "checkpoints").glob("checkpoint_*"),
                           key=lambda p: int(p.name.rpartition("_")[2]))  # fmt: skip
            if not found:
                raise ConfigurationError(f"load_state() found no checkpoint_<n> in {self.project_dir}/checkpoints; "
                                         "pass the folder save_state wrote.")  # fmt: skip
            input_dir = found[-1]
            self.project_configuration.iteration = int(found[-1].name.rpartition("_")[2]) + 1
        load_engine_state(self, Path(input_dir))

    # ------------------------------------------------------------------ experiment logging
    def init_trackers(self, project_name: str, config: Optional[dict[str, Any]] = None,
                      init_kwargs: Optional[dict[str, Any]] = None) -> None:  # fmt: skip
        """Create the loggers given as ``loggers=``/``log_with=`` (named ones in
        ``logging_dir/project_name/version_N``; ``logging_dir`` is ``project_dir`` unless a ``ProjectConfiguration``
        says otherwise) and record ``config`` as the run's hyperparameters. ``init_kwargs`` (Accelerate's
        per-tracker options) must be empty: our loggers take their options as ``Logger`` instances."""
        if not isinstance(project_name, str) or not project_name:
            raise ConfigurationError(f"init_trackers(project_name={project_name!r}) needs a non-empty name.")
        if init_kwargs:
            raise ConfigurationError(f"init_trackers(init_kwargs={init_kwargs!r}) is not supported: pass configured "
                                     "trainer.loggers Logger instances as log_with=[...] instead.")  # fmt: skip
        folder = self.project_configuration.logging_dir or self.project_dir
        self.loggers = create_trackers(self._tracker_specs, folder, project_name)
        self._trackers = [Tracker(logger) for logger in self.loggers] if self.is_main_process else []
        if config:
            for tracker in self._trackers:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker for ``name`` ("tensorboard", "csv", ...) with Accelerate's API (``log``, ``tracker``,
        ``store_init_configuration``, ``finish``; the logger's own members too); its underlying writer with
        ``unwrap`` (e.g. TensorBoard's ``SummaryWriter``). On a rank that does not log: a tracker that does
        nothing, as Accelerate's."""
        if not self.is_main_process:
            return NoOpTracker()
        for tracker in self._trackers:
            if tracker.name == name.lower():
                return tracker.tracker if unwrap else tracker
        raise ConfigurationError(f"get_tracker({name!r}): no such tracker; this run has "
                                 f"{[tracker.name for tracker in self._trackers]} (call init_trackers first).")  # fmt: skip

    @property
    def trackers(self) -> list[Tracker]:
        """The trackers :meth:`init_trackers` created, with Accelerate's API over :attr:`loggers`; empty on the
        ranks that do not log, as in Accelerate."""
        return self._trackers

    def log(self, values: dict[str, Any], step: Optional[int] = None) -> None:
        """Send scalar ``values`` (numbers or one-element tensors) to every logger, on global rank 0."""
        if self.is_main_process:
            for logger in self.loggers:
                logger.log_metrics(values, step)

    def end_training(self) -> None:
        """Finish the loggers and wait for every rank; call once at the end of a successful run."""
        if self.is_main_process:
            for logger in self.loggers:
                logger.finalize("success")
        self.wait_for_everyone()
        self.strategy.teardown()

    def __repr__(self) -> str:
        return f"Engine(strategy={self.strategy!r}, accumulate_grad_batches={self._window.size})"
