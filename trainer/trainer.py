"""``Trainer``: turns arguments into objects and runs fit/validate/test/predict.

The loops live in :mod:`trainer.loops` (hook order in :mod:`trainer.loops.fit_loop`); devices, wrapping,
precision and collectives live in the Strategy; checkpoint contents in :mod:`trainer.checkpoint.connector`.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
import signal
import sys
from datetime import timedelta
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Union

import torch

from trainer.callbacks.callback import Callback
from trainer.callbacks.trial_steps import TunerExit
from trainer.loggers.logger import Logger
from trainer.loggers.run_folder import agree_versions
from trainer.strategies.accelerators import Accelerator, accelerator_for
from trainer.strategies.connector import build_strategy
from trainer.strategies.speed.activation_checkpointing import apply_activation_checkpointing, check_block_classes
from trainer.strategies.speed.compile import check_compile
from trainer.strategies.speed.init_check import verify_initial_weights
from trainer.strategies.errors import AutomaticOptimizationError, ConfigurationError
from trainer.strategies.rank import PossibleUserWarning, rank_zero_info, rank_zero_warn
from trainer.strategies.strategy import Strategy
from trainer.data import loaders as data_utils
from trainer.checkpoint import auto_resume
from trainer.checkpoint.data_position import set_sampler_epoch
from trainer.data.combined_loader import CombinedLoader
from trainer.faults import slurm_requeue
from trainer import integrations
from trainer.config.arguments import (barebones_defaults, build_callbacks, build_loggers, check_benchmark,
                                      check_ckpt_path, check_init_setting, checkpoints_last, resolve_max_epochs,
                                      validate_arguments, with_max_time)  # fmt: skip
from trainer.checkpoint.connector import CheckpointConnector
from trainer.module.datamodule import DataModule
from trainer.data.distributed import balance_training_batches
from trainer.faults.monitor import FaultMonitor
from trainer.hooks import HookDispatcher
from trainer.module import precision_dtype
from trainer.module.overrides import overrides
from trainer.profiler.instrumentation import Instrumentation
from trainer.config.launch_defaults import with_launch_defaults
from trainer.metrics.logged_metrics import ResultCollection
from trainer.metrics.connector import MetricsConnector, print_eval_results
from trainer.loops.evaluation_loop import EvaluationLoop, PredictionLoop
from trainer.loops import fit_outcome
from trainer.loops.fit_loop import FitLoop
from trainer.loops.progress_views import EvalCounts, EvaluationLoopView
from trainer.loops.optimization import AutomaticOptimization, AutomaticOptimizer, ManualOptimization, ManualOptimizer
from trainer.loops.training_epoch_loop import TrainingEpochLoop
from trainer.module.train_module import TrainModule, configure_model_once
from trainer.module.train_mode import warn_modules_in_eval_mode
from trainer.loops.optimizers import SchedulerConfig, parse_optimizers
from trainer.config.plugins import (apply_to_strategy, check_sync_batchnorm, layer_sync_of, sort_plugins,
                                    sync_batchnorm_layers)
from trainer.profiler.profilers import Profiler, build_profiler
from trainer.reproducibility import torch_flags
from trainer.reproducibility.seed import isolated_rng, seed_everything
from trainer.spawned import run_spawned
from trainer import states
from trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus

# Lightning's ``lightning.pytorch.trainer.states`` under the rename (trainer.X for lightning.pytorch.X).
sys.modules.setdefault(f"{__name__}.states", states)


class Trainer:
    """Runs a :class:`TrainModule`'s training, validation, test and prediction.

    ``Trainer(devices=4, precision=16, accumulate_grad_batches=16).fit(module, train_loader, val_loader)``.
    Every argument is validated here, with an error naming the argument and what would be valid.
    Under ``trainer run``/``trainer slurm`` the launcher's settings fill the arguments the script leaves out.

    Faults during fit (:mod:`trainer.faults.monitor`): ``stop_signals`` finish the current optimizer step, save
    ``interrupted.ckpt`` and exit (SIGINT: raise ``KeyboardInterrupt``), :attr:`interrupted` says so;
    ``on_nonfinite_loss`` is "stop" (the default: the last good weights put back, then ``fit()`` raises
    :class:`~trainer.faults.nonfinite.NonFiniteLossError`; "ignore" under 16-mixed, whose scaler skips such steps),
    "warn" (the same stop, ``fit()`` returns), "skip", "raise" or "ignore". Under SLURM,
    SIGUSR1 also saves, requeues the job and exits; the requeued job resumes (:mod:`trainer.faults.slurm_requeue`).
    """

    @with_launch_defaults
    def __init__(
        self,
        accelerator: str = "auto",
        devices: Union[str, int, list[int]] = "auto",
        num_nodes: int = 1,
        strategy: Union[str, Strategy] = "auto",
        precision: Union[str, int] = "32-true",
        plugins: Any = None,
        sync_batchnorm: bool = False,
        max_epochs: Optional[int] = None,
        min_epochs: Optional[int] = None,
        max_steps: int = -1,
        min_steps: Optional[int] = None,
        max_time: Any = None,
        limit_train_batches: Optional[Union[int, float]] = None,
        limit_val_batches: Optional[Union[int, float]] = None,
        limit_test_batches: Optional[Union[int, float]] = None,
        limit_predict_batches: Optional[Union[int, float]] = None,
        overfit_batches: Union[int, float] = 0.0,
        val_check_interval: Union[int, float, str, timedelta, dict[str, int], None] = None,
        check_val_every_n_epoch: Optional[int] = 1,
        num_sanity_val_steps: int = 2,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: Optional[float] = None,
        gradient_clip_algorithm: Optional[str] = None,
        callbacks: Optional[Union[Callback, list[Callback]]] = None,
        logger: Union[bool, Logger, Iterable[Logger], None] = True,
        log_every_n_steps: int = 50,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
        enable_model_summary: bool = True,
        enable_autolog_hparams: bool = True,
        default_root_dir: Optional[Union[str, os.PathLike]] = None,
        deterministic: Union[bool, str] = False,
        benchmark: Optional[bool] = None,
        inference_mode: bool = True,
        fast_dev_run: Union[bool, int] = False,
        use_distributed_sampler: bool = True,
        sample_seeds: bool = True,
        reload_dataloaders_every_n_epochs: int = 0,
        detect_anomaly: bool = False,
        barebones: bool = False,
        seed: Optional[int] = None,
        on_nonfinite_loss: Optional[str] = None,
        stop_signals: Any = ("SIGTERM", "SIGINT"),
        compile: Union[bool, dict[str, Any], None] = None,
        activation_checkpointing: Union[str, type, list[Union[str, type]], None] = None,
        profiler: Union[str, Profiler, None] = None,
        check_init: Optional[bool] = None,
    ) -> None:
        settings = validate_arguments(dict(
            max_epochs=max_epochs, min_epochs=min_epochs, max_steps=max_steps, min_steps=min_steps,
            limit_train_batches=limit_train_batches, overfit_batches=overfit_batches,
            limit_val_batches=limit_val_batches, limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches, val_check_interval=val_check_interval,
            check_val_every_n_epoch=check_val_every_n_epoch, num_sanity_val_steps=num_sanity_val_steps,
            accumulate_grad_batches=accumulate_grad_batches, gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm, log_every_n_steps=log_every_n_steps,
            default_root_dir=default_root_dir, deterministic=deterministic, fast_dev_run=fast_dev_run, seed=seed,
            reload_dataloaders_every_n_epochs=reload_dataloaders_every_n_epochs, barebones=barebones,
        ))  # fmt: skip
        if barebones:
            passed = {name: value for name, value in (
                ("enable_checkpointing", enable_checkpointing), ("logger", logger),
                ("enable_progress_bar", enable_progress_bar), ("enable_model_summary", enable_model_summary),
                ("log_every_n_steps", log_every_n_steps), ("num_sanity_val_steps", num_sanity_val_steps),
                ("fast_dev_run", fast_dev_run)) if name in getattr(self, "_passed_arguments", ())}  # fmt: skip
            logger, enable_checkpointing, enable_progress_bar, enable_model_summary = barebones_defaults(
                logger, detect_anomaly, passed)
        for name, value in settings.items():
            setattr(self, name, value)
        self.use_distributed_sampler = bool(use_distributed_sampler)
        #: Seed each training sample's torch/random/numpy generators from (run seed, epoch, index) (exact resume
        #: with workers and random augmentation; see docs/checkpointing.md). False: the workers' own streams.
        self.sample_seeds = bool(sample_seeds)
        self.detect_anomaly = bool(detect_anomaly)
        self.enable_checkpointing = bool(enable_checkpointing)
        self.enable_progress_bar = bool(enable_progress_bar)
        self.enable_model_summary = bool(enable_model_summary)
        self.enable_autolog_hparams = bool(enable_autolog_hparams)
        self.inference_mode = bool(inference_mode)
        self.sync_batchnorm = bool(sync_batchnorm)
        self.compile = check_compile(compile)
        self.activation_checkpointing = check_block_classes(activation_checkpointing)
        #: Build configure_model() eagerly once more and compare every rank's materialised tensors with it
        #: (``TRAINER_CHECK_INIT=1`` sets it for every Trainer of a run).
        self.check_init = check_init_setting(check_init)
        self._init_reference: Optional[dict[str, torch.Tensor]] = None
        self.profiler: Optional[Profiler] = build_profiler(profiler)
        if seed is not None:
            seed_everything(seed)
        plugin_settings = sort_plugins(plugins, precision)
        self.strategy: Strategy = build_strategy(accelerator, devices, num_nodes, strategy,
                                                 plugin_settings.precision or precision,
                                                 plugin_settings.cluster_environment)  # fmt: skip
        apply_to_strategy(self.strategy, plugin_settings)
        self._layer_sync = layer_sync_of(self.sync_batchnorm, plugin_settings)
        self.sync_batchnorm = self._layer_sync is not None
        check_sync_batchnorm(self._layer_sync, self.strategy)
        self.precision: str = self.strategy.precision.name
        self.num_nodes = num_nodes
        check_benchmark(benchmark, deterministic)
        self.benchmark = benchmark  # with deterministic: torch flags held while a stage runs, then put back

        self.module: Optional[TrainModule] = None
        self.datamodule: Optional[DataModule] = None
        self.should_stop = False
        self.sanity_checking = False
        self.state_stage: Optional[str] = None
        self.fit_loop = FitLoop(self)
        #: Lightning's loop objects of validate/test/predict, as far as users read them (``batch_progress``).
        self.validate_loop = EvaluationLoopView(EvalCounts())
        self.test_loop = EvaluationLoopView(EvalCounts())
        self.predict_loop = EvaluationLoopView(EvalCounts())
        #: When the last evaluation ended (``time.monotonic()``), read only with a time-based ``val_check_interval``.
        self._last_val_time = 0.0
        self._checkpoint = CheckpointConnector(self)
        self._faults = FaultMonitor(self, stop_signals, on_nonfinite_loss)
        slurm_requeue.connect(self)
        integrations.connect(self)  # Ray Train's report and resume, when this is a Ray Train worker
        self.ckpt_path: Optional[str] = None  # the checkpoint the last fit/validate/test restored
        self._optimizers: list[torch.optim.Optimizer] = []
        #: What ``module.optimizers()`` returns: the optimizers wrapped to step through the strategy.
        self._wrapped_optimizers: list[Union[AutomaticOptimizer, ManualOptimizer]] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self._results: Optional[ResultCollection] = None  # the running stage's; read by module.log (hot path)
        self._metrics = MetricsConnector(self)
        self._train_dataloader: Any = None
        self._val_dataloaders: list[Any] = []
        self._val_batch_limits: list[float] = []
        self.num_training_batches: float = 0
        self._val_enabled = False
        # fit's data sources, requested when first needed (validation's in the sanity check, training's after it)
        self._fit_sources: tuple[Any, Any, Optional[DataModule]] = (None, None, None)
        self._val_loaded = False
        self._last_train_reload_epoch: Optional[int] = None
        self._train_batches_agreed = False  # num_training_batches agreed across ranks
        self._last_val_reload_epoch: float = -math.inf
        self._eval_data: dict[str, tuple[list[Any], list[float], Any]] = {}  # validate/test/predict: loaders,
        self._eval_given: Any = None  # limits, and the loaders as given (their shape)
        self._val_given: Any = None  # fit's validation loaders as given
        self._state_fn: Optional[TrainerFn] = None
        self._status = TrainerStatus.INITIALIZING
        self._hooks: Optional[HookDispatcher] = None
        #: Functions ``iterator -> iterator`` applied to each epoch's training iterator (e.g. to time ``next()``);
        #: applied once per epoch, so the loop pays nothing when the list is empty.
        self.train_iterator_wrappers: list[Callable[[Iterator[Any]], Iterator[Any]]] = []
        self.loggers: list[Logger] = build_loggers(logger, self.default_root_dir, self.fast_dev_run)
        self.callbacks: list[Callback] = build_callbacks(
            callbacks, self.enable_checkpointing, self.enable_progress_bar, self.enable_model_summary
        )
        self.callbacks = with_max_time(self.callbacks, max_time, self.enable_checkpointing)
        if getattr(self.strategy, "replica_metrics", None) is not None:  # ft_ddp / ft_hsdp: log ft/replicas & co.
            from trainer.callbacks.replica_monitor import ReplicaMonitor

            if not any(isinstance(cb, ReplicaMonitor) for cb in self.callbacks):
                self.callbacks.append(ReplicaMonitor())

    @classmethod
    def from_config(cls, config: Union[str, os.PathLike, dict[str, Any], None] = None, **defaults: Any) -> "Trainer":
        """Build a Trainer from an experiment file's ``trainer:`` section (see :mod:`trainer.config.yaml_config`).

        ``config=None`` takes the file given to ``trainer run --config``; ``defaults`` are overridden by the
        file, which is overridden by ``--trainer.*`` arguments. Unknown keys are errors listing the valid ones.
        """
        from trainer.config.yaml_config import build_from_config

        return build_from_config(cls, config, defaults)

    # ------------------------------------------------------------------ entry points
    def fit(
        self,
        model: TrainModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: Optional[DataModule] = None,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
    ) -> None:
        """Train ``model``; ``ckpt_path`` ("last", "best" or a file) resumes exactly where that run stopped."""
        if isinstance(train_dataloaders, DataModule):
            if datamodule is not None:
                raise ConfigurationError("fit() got a DataModule twice (as train_dataloaders and datamodule).")
            datamodule, train_dataloaders = train_dataloaders, None
        if datamodule is not None and (train_dataloaders is not None or val_dataloaders is not None):
            raise ConfigurationError("fit(): pass either dataloaders or a datamodule, not both.")
        self._check_module(model, "fit")
        check_ckpt_path(ckpt_path, "fit")
        from trainer.callbacks.timer import Timer

        self.max_epochs = resolve_max_epochs(self.max_epochs, self.max_steps,
                                             any(isinstance(c, Timer) for c in self.callbacks))  # fmt: skip
        self._launch(self._fit_impl, model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)

    def validate(
        self,
        model: Optional[TrainModule] = None,
        dataloaders: Any = None,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
        datamodule: Optional[DataModule] = None,
        verbose: bool = True,
    ) -> list[dict[str, float]]:
        """Run one validation epoch; returns one dict of metrics per dataloader."""
        return self._evaluate("validate", model, dataloaders, ckpt_path, datamodule, verbose)

    def test(
        self,
        model: Optional[TrainModule] = None,
        dataloaders: Any = None,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
        datamodule: Optional[DataModule] = None,
        verbose: bool = True,
    ) -> list[dict[str, float]]:
        """Run one test epoch; returns one dict of metrics per dataloader."""
        return self._evaluate("test", model, dataloaders, ckpt_path, datamodule, verbose)

    def predict(
        self,
        model: Optional[TrainModule] = None,
        dataloaders: Any = None,
        datamodule: Optional[DataModule] = None,
        return_predictions: bool = True,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
    ) -> Any:
        """Run ``predict_step`` over the data; returns the outputs (one list per dataloader if several)."""
        if isinstance(dataloaders, DataModule):
            datamodule, dataloaders = dataloaders, None
        ckpt_path = self._ckpt_path_without_model("predict", model, check_ckpt_path(ckpt_path, "predict"))
        model = self._model_or_fitted(model, "predict")
        return self._launch(self._predict_impl, model, dataloaders, datamodule, return_predictions, ckpt_path)

    def save_checkpoint(self, filepath: Union[str, os.PathLike], weights_only: bool = False,
                        asynchronous: bool = False) -> None:  # fmt: skip
        """Write a checkpoint of the current state (atomically; global rank 0 writes, all ranks must call).

        ``weights_only=True`` keeps the module weights and hyperparameters only (for inference or a new fit);
        ``asynchronous=True`` copies the state now and writes it in the background."""
        if self.module is None:
            raise RuntimeError("save_checkpoint() needs a module: call it during or after fit/validate/test.")
        self._checkpoint.save(filepath, weights_only, asynchronous)

    def init_module(self, empty_init: Optional[bool] = None) -> ContextManager:
        """Context to build modules in: on ``meta`` under sharded strategies (``empty_init=False``: real tensors), else
        on the device in the precision's dtype (``empty_init=True``: no random init). ``configure_model`` runs in it."""
        return self.strategy.module_init_context(empty_init)

    # ------------------------------------------------------------------ stage implementations
    def _launch(self, fn: Any, *args: Any) -> Any:
        launcher = self.strategy.launcher
        if launcher is None:
            return fn(*args)
        if launcher.runs_in_caller:
            return launcher.launch(fn, *args)
        try:
            return run_spawned(self, launcher, fn, *args)
        except BaseException as exc:
            # The ranks ran on copies: the caller's own callbacks (and datamodule) hear of the failure too, as
            # Lightning calls on_exception in the launching process.
            module = next((arg for arg in args if isinstance(arg, TrainModule)), None)
            for callback in self.callbacks:
                callback.on_exception(self, module, exc)
            datamodule = next((arg for arg in args if isinstance(arg, DataModule)), None)
            if datamodule is not None:
                datamodule.on_exception(exc)
            raise

    def _fit_impl(self, model: TrainModule, train_dataloaders: Any, val_dataloaders: Any,
                  datamodule: Optional[DataModule], ckpt_path: Any) -> None:  # fmt: skip
        self._begin_fit_data(model, train_dataloaders, val_dataloaders, datamodule)
        with self._stage("fit", model, datamodule):
            if self.sync_batchnorm:
                sync_batchnorm_layers(model, self.strategy, self._layer_sync)
            self._setup_module(model)
            self.should_stop = False
            # Lightning's order: the module's and callbacks' state before configure_optimizers, the optimizers'
            # and schedulers' after on_fit_start (see trainer.loops.fit_loop).
            ckpt_path = auto_resume.fit_ckpt_path(self, ckpt_path)  # "auto" in a restarted job
            after_setup = self.strategy.restore_checkpoint_after_setup  # reading it needs the optimizers
            restoring = (ckpt_path is not None and not after_setup
                         and self._checkpoint.restore_modules_and_callbacks(ckpt_path))  # fmt: skip
            self._setup_optimizers(model)
            if ckpt_path is not None and after_setup:
                restoring = self._checkpoint.restore_modules_and_callbacks(ckpt_path)
            if not restoring:
                fit_outcome.warn_if_already_done(self)  # a second fit() on a finished Trainer
            warn_modules_in_eval_mode(model)  # each submodule keeps its own mode, as in Lightning
            self._call_hook("on_fit_start")
            # Every stage starts without gradients, as in Lightning; before the rest of the restore, since a
            # checkpoint saved inside an accumulation window brings that window's gradients back (exact resume).
            model.zero_grad()
            if restoring:
                self._checkpoint.restore_training_state()
            progress = self.fit_loop.progress
            trained_from = None if self.fit_loop.done else (progress.global_step, progress.total_batches)
            if self.enable_autolog_hparams:
                self._metrics.log_hyperparams(model, self.datamodule)
            with self._faults.watch():  # stop signals, non-finite losses
                self._run_sanity_check(restoring)
                self._load_train_data_once()  # after the sanity check, as Lightning requests it
                epoch_loop = TrainingEpochLoop(self, self._optimization)
                self._results = self._metrics.train
                with torch.autograd.set_detect_anomaly(True) if self.detect_anomaly else contextlib.nullcontext():
                    self.fit_loop.run(epoch_loop)
            if trained_from is not None and not self.interrupted:  # on_nonfinite_loss="warn" has said why already
                fit_outcome.warn_if_no_step(self, *trained_from)
            self._call_hook("on_fit_end")
            self._metrics.finalize(self._faults.status)

    def _evaluate(self, stage: str, model: Optional[TrainModule], dataloaders: Any, ckpt_path: Any,
                  datamodule: Optional[DataModule], verbose: bool) -> list[dict[str, float]]:  # fmt: skip
        if isinstance(dataloaders, DataModule):
            datamodule, dataloaders = dataloaders, None
        ckpt_path = self._ckpt_path_without_model(stage, model, check_ckpt_path(ckpt_path, stage))
        model = self._model_or_fitted(model, stage)
        step = "validation_step" if stage == "validate" else "test_step"
        if not overrides(model, TrainModule, step):
            raise ConfigurationError(f"{stage}() needs {type(model).__name__}.{step} to be implemented.")
        return self._launch(self._evaluate_impl, stage, model, dataloaders, ckpt_path, datamodule, verbose)

    def _evaluate_impl(self, stage: str, model: TrainModule, dataloaders: Any, ckpt_path: Any,
                       datamodule: Optional[DataModule], verbose: bool) -> list[dict[str, float]]:  # fmt: skip
        with self._stage(stage, model, datamodule):
            self._setup_module(model)
            self.ckpt_path = None  # the checkpoint this stage restores, if any (Lightning's trainer.ckpt_path)
            if ckpt_path is not None:
                self._checkpoint.restore_weights(ckpt_path)
            model.zero_grad()  # every stage starts without gradients, as in Lightning
            limit = self.limit_val_batches if stage == "validate" else self.limit_test_batches
            if limit == 0:  # the stage is off, as in Lightning: no loader requested, no loop hooks, no results
                self._metrics.finalize("success")
                return []
            # The loaders are requested after the module's set-up and restore, as Lightning requests them.
            source = "val_dataloader" if stage == "validate" else "test_dataloader"
            loaders = self._eval_loaders(dataloaders, datamodule, model, source, f"{stage}(dataloaders=...)")
            limits = [data_utils.limited_batches(dl, limit, f"limit_{'val' if stage == 'validate' else 'test'}_batches")
                      for dl in loaders]  # fmt: skip
            self._eval_data[stage] = (loaders, limits, self._eval_given)
            self._set_eval_sampler_epochs(loaders)
            results = self._metrics.new_collection(stage)
            outputs = EvaluationLoop(self, stage, self._stage_loop(stage).counts).run(loaders, limits, results)
            if verbose and self.is_global_zero:
                print_eval_results(stage, outputs)
            self._metrics.finalize("success")
            return outputs

    def _predict_impl(self, model: TrainModule, dataloaders: Any, datamodule: Optional[DataModule],
                      return_predictions: bool, ckpt_path: Any) -> Any:  # fmt: skip
        with self._stage("predict", model, datamodule):
            self._setup_module(model)
            self.ckpt_path = None  # the checkpoint this stage restores, if any (Lightning's trainer.ckpt_path)
            if ckpt_path is not None:
                self._checkpoint.restore_weights(ckpt_path)
            model.zero_grad()
            if self.limit_predict_batches == 0:  # the stage is off, as in Lightning
                return [] if return_predictions else None
            loaders = self._eval_loaders(dataloaders, datamodule, model, "predict_dataloader", "predict(dataloaders=...)")
            limits = [data_utils.limited_batches(dl, self.limit_predict_batches, "limit_predict_batches") for dl in loaders]
            self._eval_data["predict"] = (loaders, limits, self._eval_given)
            self._set_eval_sampler_epochs(loaders)
            return PredictionLoop(self, self.predict_loop.counts).run(loaders, limits, return_predictions)

    @contextlib.contextmanager
    def _stage(self, stage: str, model: TrainModule, datamodule: Optional[DataModule]):
        """Set-up common to every stage; on_exception and teardown however the stage ends."""
        self.state_stage = stage
        self._state_fn, self._status = TrainerFn(stage), TrainerStatus.RUNNING
        self.strategy.setup_environment()
        if self.strategy.world_size > 1 and self.loggers:
            agree_versions(self.loggers, self.strategy.broadcast)  # rank 0 claimed the version folder
        model.trainer = self
        self.module = model
        if datamodule is not None:
            self.datamodule = datamodule
            datamodule.trainer = self
        self._hooks = HookDispatcher(self._callbacks_with(model), model)
        profiling = Instrumentation.attach(self, stage) if self.profiler is not None else None
        finished = False
        saved_flags = torch_flags.apply(self.deterministic, self.benchmark)
        try:
            data_utils.prepare_data(self.strategy, model, datamodule)
            if datamodule is not None:
                datamodule.setup(stage=stage)
            self._call_hook("setup", stage=stage)
            self._init_reference = configure_model_once(model, self.strategy, self.check_init)
            self._metrics.reset()  # each stage starts without the metrics of the one before, as in Lightning
            yield
            self._checkpoint.finish_writes()  # an asynchronous save still in flight, and its error
            finished = True
            if self._status is not TrainerStatus.INTERRUPTED:  # a stop signal or a non-finite loss said otherwise
                self._status = TrainerStatus.FINISHED
        except TunerExit:
            finished = True  # a finder run by trainer.tuner.Tuner is done: the fit ends here, cleanly
        except BaseException as exc:
            self._status = TrainerStatus.INTERRUPTED
            for hook in self._hooks.callback_hooks["on_exception"]:
                hook(self, model, exc)
            if self.datamodule is not None:
                self.datamodule.on_exception(exc)
            self._metrics.finalize("interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "failed")
            raise
        finally:
            torch_flags.restore(saved_flags)  # deterministic/benchmark: a later Trainer starts from the script's
            if datamodule is not None:  # datamodule → callbacks → module, as in Lightning
                datamodule.teardown(stage=stage)
            self._call_hook("teardown", stage=stage)
            self._results = None
            self.state_stage = None
            if profiling is not None:
                profiling.detach(stage)
            if finished:  # after a failure a peer may be gone: leave the process group to the launcher
                self.strategy.teardown()

    # ------------------------------------------------------------------ set-up helpers
    def _check_module(self, model: Any, stage: str) -> None:
        if not isinstance(model, TrainModule):
            raise ConfigurationError(
                f"{stage}() needs a TrainModule; got {type(model).__name__}. Subclass trainer.TrainModule "
                "(a torch.nn.Module with training_step and configure_optimizers)."
            )

    def _ckpt_path_without_model(self, stage: str, model: Optional[TrainModule], ckpt_path: Any) -> Any:
        """As Lightning: ``trainer.test()`` with neither a model nor ``ckpt_path`` after ``fit`` evaluates the best
        checkpoint of that fit (``ckpt_path="best"``), with a warning saying so; an error if none was saved."""
        if model is not None or ckpt_path is not None or self.module is None:
            return ckpt_path
        rank_zero_warn(f"`.{stage}(ckpt_path=None)` was called without a model. The best model of the previous `fit` "
                       f"call will be used. You can pass `.{stage}(ckpt_path='best')` to use the best model or "
                       f"`.{stage}(ckpt_path='last')` to use the last model, or pass the model to evaluate its "
                       "weights as they are. If you pass a value, this warning will be silenced.")  # fmt: skip
        return "best"

    def _model_or_fitted(self, model: Optional[TrainModule], stage: str) -> TrainModule:
        if model is None:
            if self.module is None:
                raise ConfigurationError(f"{stage}() needs a model: pass it as {stage}(model, ...), or call fit() first.")
            return self.module
        self._check_module(model, stage)
        return model

    def _callbacks_with(self, model: TrainModule) -> list[Callback]:
        extra = model.configure_callbacks()
        extra = [extra] if isinstance(extra, Callback) else list(extra or [])
        if extra:
            replaced = {type(cb) for cb in extra}
            self.callbacks = checkpoints_last([cb for cb in self.callbacks if type(cb) not in replaced] + extra)
        for callback in self.callbacks:
            # As in Lightning, `self.log(...)`/`self.log_dict(...)` in a callback's hook log through the module
            # (a callback class with a `log` of its own keeps it).
            if not hasattr(type(callback), "log"):
                callback.log = model.log
            if not hasattr(type(callback), "log_dict"):
                callback.log_dict = model.log_dict
        return self.callbacks

    def _begin_fit_data(self, model: TrainModule, train: Any, val: Any, datamodule: Optional[DataModule]) -> None:
        """Remember where fit's data comes from. As in Lightning, nothing is requested yet: the validation loaders
        when validation first runs (the sanity check), the training loader after the sanity check (or when
        something reads ``train_dataloader``/``estimated_stepping_batches`` before)."""
        self._fit_sources = (train, val, datamodule)
        self._train_dataloader, self._last_train_reload_epoch = None, None
        self._val_dataloaders, self._val_batch_limits, self._val_loaded = [], [], False
        self._last_val_reload_epoch = -math.inf
        has_step = overrides(model, TrainModule, "validation_step")
        if val is not None and not has_step:
            rank_zero_warn(f"fit() got val_dataloaders, but {type(model).__name__} has no validation_step: "
                           "validation is skipped. Implement validation_step to validate during fit.")  # fmt: skip
        self._val_enabled = (has_step and self.limit_val_batches != 0
                             and data_utils.source_defined(val, datamodule, model, "val_dataloader"))  # fmt: skip

    def _load_train_data_once(self) -> None:
        """Request the training loader(s) unless this fit already has them; every rank calls this at the same
        point, so the batch count is agreed across ranks here if an earlier read requested them on one rank."""
        if self._last_train_reload_epoch is None:
            self._load_train_data()
        elif not self._train_batches_agreed:
            self._agree_on_train_batches()

    def _load_train_data(self, agree: bool = True) -> None:
        train, _, datamodule = self._fit_sources
        self._set_train_dataloader(data_utils.fit_train_loader(train, datamodule, self.module), "train_dataloaders",
                                   agree)  # fmt: skip
        self._last_train_reload_epoch = self.current_epoch
        if self.loggers and not self.fast_dev_run and self.num_training_batches < self.log_every_n_steps:
            rank_zero_warn(f"The number of training batches ({self.num_training_batches}) is smaller than the logging "
                           f"interval Trainer(log_every_n_steps={self.log_every_n_steps}): training values reach the "
                           "loggers less than once per epoch. Lower log_every_n_steps to see them every epoch.",
                           category=PossibleUserWarning)  # fmt: skip

    def _load_val_data(self) -> None:
        """Request fit's validation loaders where Lightning does: the first time validation runs, then again when
        ``reload_dataloaders_every_n_epochs`` epochs passed since the last request (counted from a validating epoch)."""
        every, epoch = self.reload_dataloaders_every_n_epochs, self.current_epoch
        if self._val_loaded and not (every and epoch - self._last_val_reload_epoch >= every):
            return
        every_val = self.check_val_every_n_epoch
        if not self.sanity_checking or every_val is None or (epoch + 1) % every_val == 0:
            self._last_val_reload_epoch = epoch
        _, val, datamodule = self._fit_sources
        given = data_utils.loader_from(val, datamodule, self.module, "val_dataloader")
        self._val_dataloaders = self._prepare_loaders(data_utils.as_loader_list(given), "val_dataloaders",
                                                      training=False, overfit=self.overfit_batches)  # fmt: skip
        self._val_given = given
        self._val_batch_limits = [data_utils.limited_batches(dl, self.limit_val_batches, "limit_val_batches")
                                  for dl in self._val_dataloaders]  # fmt: skip
        self._val_loaded = True
        self._val_enabled = any(limit > 0 for limit in self._val_batch_limits)

    def _set_eval_sampler_epochs(self, loaders: list[Any]) -> None:
        """Each evaluation loader's sampler gets ``set_epoch`` (the epochs fit completed), as in Lightning, for
        samplers that shuffle validation by the training progress."""
        for loader in loaders:
            for child in loader.flattened if isinstance(loader, CombinedLoader) else [loader]:
                set_sampler_epoch(child, self.current_epoch)

    def _eval_loaders(self, loaders: Any, datamodule: Optional[DataModule], model: TrainModule,
                      source: str, argument: str) -> list[Any]:  # fmt: skip
        given = data_utils.loader_from(loaders, datamodule, model, source)
        loaders = data_utils.as_loader_list(given)
        if not loaders:
            raise ConfigurationError(
                f"No data: pass {argument}, a datamodule with {source}(), or implement {source}() on the module."
            )
        self._eval_given = given  # the shape test_dataloaders & co. give the loaders back in
        return self._prepare_loaders(loaders, argument, training=False)

    def _prepare_loaders(self, loaders: list[Any], argument: str, training: bool, overfit: float = 0) -> list[Any]:
        """Check each loader and split it across ranks (the training loader gets a shuffling sampler); fit's
        loaders under ``overfit_batches`` read in order."""
        sampler_kwargs = self.strategy.distributed_sampler_kwargs
        pin = self.strategy.root_device.type == "cuda"
        return [data_utils.ready_loader(dl, argument, training, sampler_kwargs, self.use_distributed_sampler,
                                        overfit, pin) for dl in loaders]  # fmt: skip

    def _setup_module(self, model: TrainModule) -> None:
        """Activation checkpointing, the strategy's placing and wrapping, then ``compile`` where the wrapper needs it."""
        if self.activation_checkpointing:
            apply_activation_checkpointing(model, self.activation_checkpointing)
        before = precision_dtype.undo_earlier_conversion(model, self.strategy.precision)  # e.g. 64-true, then 32-true
        self.strategy.setup_module(model)
        if self._init_reference is not None:
            reference, self._init_reference = self._init_reference, None
            compared = verify_initial_weights(model, reference)
            rank_zero_info("check_init: the %d tensors of this rank equal the eager one-device build", compared)
        precision_dtype.remember_conversion(model, before, self.strategy.precision)
        if self.compile is not None:
            module = self.strategy.module if self.strategy.module is not None else model
            self.strategy.compile_module(module, self.compile)

    def _setup_optimizers(self, model: TrainModule) -> None:
        optimizers, schedulers = parse_optimizers(model.configure_optimizers(), model.automatic_optimization)
        self._optimizers = self.strategy.setup_optimizers(optimizers)
        self.lr_scheduler_configs = schedulers
        if overrides(model, TrainModule, "lr_scheduler_step"):
            for config in schedulers:
                config.step_fn = model.lr_scheduler_step
        if model.automatic_optimization:
            if "optimizer_idx" in inspect.signature(model.training_step).parameters:
                raise AutomaticOptimizationError(
                    "training_step takes optimizer_idx, which automatic optimisation never passes (Lightning 1.x's "
                    "multiple-optimizer loop). Remove the `optimizer_idx` argument from `training_step`; to step "
                    "several optimizers, set self.automatic_optimization = False and step them in training_step."
                )
            if len(self._optimizers) > 1:
                raise AutomaticOptimizationError(
                    f"configure_optimizers returned {len(self._optimizers)} optimizers: training with multiple "
                    "optimizers is only supported with manual optimization. Set self.automatic_optimization = False "
                    "and step them in training_step."
                )
            self._optimization: Any = AutomaticOptimization(self, self._optimizers[0] if self._optimizers else None)
            wrapper = self._optimization.wrapper
            self._wrapped_optimizers = [wrapper] if wrapper is not None else []
        else:
            self._optimization = ManualOptimization(self)
            self._wrapped_optimizers = [ManualOptimizer(opt, self) for opt in self._optimizers]

    def _train_iterator(self, epoch: int, start_batch: int) -> Any:
        iterator = self._checkpoint.train_iterator(self._train_dataloader, epoch, start_batch)
        for wrap in self.train_iterator_wrappers:
            iterator = wrap(iterator)
        return iterator

    def reset_train_dataloader(self, loader: Any) -> None:
        """Train on ``loader`` from now on (e.g. set in ``on_fit_start`` by a callback that changed the batch
        size); it is split across ranks like the original and ``num_training_batches`` is recomputed."""
        if self.module is None or self.state_stage != "fit":
            raise RuntimeError("reset_train_dataloader() can only be called while fit() runs.")
        self._set_train_dataloader(loader, "reset_train_dataloader(loader)")
        self._last_train_reload_epoch = self.current_epoch  # fit keeps it (until reload_dataloaders_every_n_epochs)

    def reset_val_dataloader(self) -> None:
        """During fit (e.g. from a callback's ``on_fit_start``): request the validation loaders again from where fit
        gets them (the module's/datamodule's ``val_dataloader()``, or the loaders passed), for a callback that changed
        the batch size they read. Nothing happens when the fit does not validate."""
        if self.module is None or self.state_stage != "fit":
            raise RuntimeError("reset_val_dataloader() can only be called while fit() runs.")
        if self._val_enabled:
            self._val_loaded = False
            self._load_val_data()

    def reset_eval_dataloader(self, loader: Any) -> None:
        """During validate/test/predict, from ``on_validation_start``/``on_test_start``/``on_predict_start`` (e.g. by
        a callback that changed the batch size): run the stage on ``loader`` (one loader) instead of its own."""
        stage = self.state_stage
        if stage not in ("validate", "test", "predict") or stage not in self._eval_data:
            raise RuntimeError("reset_eval_dataloader() can only be called while validate(), test() or predict() runs "
                               "(from on_validation_start, on_test_start or on_predict_start).")  # fmt: skip
        loaders, limits, _ = self._eval_data[stage]
        limit_name = "limit_val_batches" if stage == "validate" else f"limit_{stage}_batches"
        [ready] = self._prepare_loaders([loader], "reset_eval_dataloader(loader)", training=False)
        # In place: the loop reads these lists after its start hooks.
        loaders[:] = [ready]
        limits[:] = [data_utils.limited_batches(ready, getattr(self, limit_name), limit_name)]
        self._eval_data[stage] = (loaders, limits, loader)

    def _set_train_dataloader(self, loader: Any, argument: str, agree: bool = True) -> None:
        [self._train_dataloader] = self._prepare_loaders([data_utils.as_training_loader(loader)], argument, training=True,
                                                         overfit=self.overfit_batches)  # fmt: skip
        self.num_training_batches = data_utils.limited_batches(self._train_dataloader, self.limit_train_batches,
                                                               "limit_train_batches")  # fmt: skip
        self._train_batches_agreed = False
        if agree:
            self._agree_on_train_batches()

    def _agree_on_train_batches(self) -> None:
        if self.strategy.world_size > 1:  # ranks that run different batch counts would deadlock in DDP
            self.num_training_batches = balance_training_batches(self.strategy.reduce, self.num_training_batches)
        self._train_batches_agreed = True

    def _run_sanity_check(self, restoring: bool) -> None:
        """As in Lightning: before every fit but one resumed from a checkpoint (a second ``fit()`` runs it too)."""
        steps = self.num_sanity_val_steps
        if not self._val_enabled or steps == 0 or restoring:
            return
        self.sanity_checking = True
        try:
            with isolated_rng():  # a check must not change the training that follows
                for hook in self._hooks.callback_hooks["on_sanity_check_start"]:
                    hook(self, self.module)
                self._load_val_data()  # inside the isolated RNG, as Lightning requests it
                limits = [limit if steps == -1 else min(steps, limit) for limit in self._val_batch_limits]
                if any(limit > 0 for limit in limits):
                    self._set_eval_sampler_epochs(self._val_dataloaders)
                    EvaluationLoop(self, "validate", self.fit_loop.val_loop.counts).run(
                        self._val_dataloaders, limits, self._metrics.val, False)
                for hook in self._hooks.callback_hooks["on_sanity_check_end"]:
                    hook(self, self.module)
        finally:
            self.sanity_checking = False
            self._metrics.val.reset()
            self.fit_loop.val_loop.counts.reset()  # as in Lightning, the sanity check's batches are not counted

    def _run_validation_in_fit(self) -> None:
        progress = self.fit_loop.progress
        self._load_val_data()
        if not self._val_enabled:  # the loaders hold no batches
            progress.val_pending = False
            return
        self._set_eval_sampler_epochs(self._val_dataloaders)

        def mark_done() -> None:
            progress.val_pending = False  # a checkpoint saved in on_validation_end must not re-run this validation
            if progress.plateau_pending:  # ... and must step the step's plateau schedulers with these values
                metrics = self.callback_metrics
                progress.plateau_metrics = {
                    c.monitor: float(metrics[c.monitor]) for c in self.lr_scheduler_configs
                    if c.interval == "step" and c.reduce_on_plateau and c.monitor in metrics
                }  # fmt: skip

        EvaluationLoop(self, "validate", self.fit_loop.val_loop.counts).run(
            self._val_dataloaders, self._val_batch_limits, self._metrics.val, True, mark_done)
        progress.val_pending = False

    def _stage_loop(self, stage: str) -> EvaluationLoopView:
        return self.validate_loop if stage == "validate" else self.test_loop

    def _can_stop(self, epochs_done: int) -> bool:
        """A stop request is honoured once ``min_epochs`` epochs and ``min_steps`` steps are done."""
        return ((self.min_epochs is None or epochs_done >= self.min_epochs)
                and (self.min_steps is None or self.global_step >= self.min_steps))  # fmt: skip

    def _reload_fit_dataloaders(self) -> None:
        """``reload_dataloaders_every_n_epochs``: at an epoch's start, ask for the training loader again once that
        many epochs passed since the last request (validation's are asked again when validation runs)."""
        every, last = self.reload_dataloaders_every_n_epochs, self._last_train_reload_epoch
        if every and (last is None or self.current_epoch - last >= every):
            self._load_train_data()

    def _call_hook(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._hooks(self, name, *args, **kwargs)

    # ------------------------------------------------------------------ public properties
    @property
    def global_step(self) -> int:
        """Optimizer steps taken (not micro-batches)."""
        return self.fit_loop.progress.global_step

    @property
    def current_epoch(self) -> int:
        """The epoch being run (0-based); after fit, the number of epochs completed."""
        return self.fit_loop.progress.epoch

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps the 16-mixed gradient scaler skipped because gradients were inf/nan."""
        return self.fit_loop.progress.skipped_steps

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers from ``configure_optimizers`` (after strategy set-up)."""
        return self._optimizers

    @property
    def lr_schedulers(self) -> list[Any]:
        """The LR schedulers from ``configure_optimizers``."""
        return [config.scheduler for config in self.lr_scheduler_configs]

    @property
    def world_size(self) -> int:
        """Processes in the job."""
        return self.strategy.world_size

    @property
    def global_rank(self) -> int:
        """This process's rank in the job."""
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        """This process's rank on its node."""
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        """This process's node index."""
        return self.strategy.node_rank

    @property
    def is_global_zero(self) -> bool:
        """True on the process that writes logs and checkpoints."""
        return self.strategy.is_global_zero

    @property
    def callback_metrics(self) -> dict[str, Any]:
        """Latest value of everything logged (tensors): what checkpointing/early stopping monitor.

        Reading it never issues a collective: ``sync_dist`` values are the ones reduced at the last logging
        interval or epoch end (the local value in between)."""
        return self._metrics.read_callback_metrics()

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """What was sent to the loggers (and the training values logged for them since the last write)."""
        return self._metrics.read_logged_metrics()

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Values logged with ``prog_bar=True`` (floats), plus ``skipped_steps`` when the scaler skipped any."""
        return self._metrics.read_progress_bar_metrics()

    @property
    def logger(self) -> Optional[Logger]:
        """The first logger, or ``None``."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's folder, else ``default_root_dir``."""
        if self.loggers and self.loggers[0].log_dir is not None:
            return str(self.loggers[0].log_dir)
        return str(self.default_root_dir)

    @property
    def checkpoint_callbacks(self) -> list[Callback]:
        """Every checkpointing callback (those with a ``best_model_path``)."""
        return [cb for cb in self.callbacks if hasattr(cb, "best_model_path")]

    @property
    def checkpoint_callback(self) -> Optional[Callback]:
        """The first checkpointing callback, or ``None``."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def lightning_module(self) -> Optional[TrainModule]:
        """Alias of :attr:`module` for code written for Lightning."""
        return self.module

    @property
    def model(self) -> Any:
        """The module as the strategy runs it (possibly wrapped, e.g. by DDP)."""
        return self.strategy.model if self.strategy.model is not None else self.module

    @property
    def train_dataloader(self) -> Any:
        """The training dataloader(s) in use (after distributed sampler injection), in the shape given, as in
        Lightning: one loader, or the list/dict of loaders (a ``CombinedLoader``'s ``iterables``). During fit the
        first read requests them. The batches the loop iterates: ``trainer.fit_loop.combined_loader``."""
        loader = self._training_data()
        return loader.iterables if isinstance(loader, CombinedLoader) else loader

    def _training_data(self) -> Any:
        """Fit's training data as the loop iterates it (a ``CombinedLoader`` for several loaders)."""
        if self._last_train_reload_epoch is None and self.state_stage == "fit":
            self._load_train_data(agree=False)  # maybe on one rank only: no collective here
        return self._train_dataloader

    @property
    def val_dataloaders(self) -> Any:
        """The validation dataloader(s) of the running (or last) ``fit`` or ``validate``."""
        if self._state_fn == TrainerFn.VALIDATING and "validate" in self._eval_data:
            return data_utils.in_given_shape(*self._eval_data["validate"][::2])
        return data_utils.in_given_shape(self._val_dataloaders, self._val_given)

    @property
    def num_val_batches(self) -> list[float]:
        """Batches run per validation dataloader (of ``validate`` while it runs, else of fit)."""
        if self._state_fn == TrainerFn.VALIDATING and "validate" in self._eval_data:
            return list(self._eval_data["validate"][1])
        return list(self._val_batch_limits)

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the whole fit will take (for OneCycleLR-style schedulers in configure_optimizers; the
        training loader is requested for it if fit has not yet)."""
        self._training_data()
        per_epoch = -(-self.num_training_batches // self.accumulate_grad_batches) if self.num_training_batches else 0
        max_epochs = self.max_epochs
        if max_epochs is None:  # read before fit: the value fit will resolve to
            max_epochs = -1 if self.max_steps != -1 else 1000
        if max_epochs == -1:
            total = float("inf")
        else:
            total = per_epoch * max_epochs
        if self.max_steps != -1:
            total = min(total, self.max_steps)
        return total

    @property
    def training(self) -> bool:
        """True while fit is running training batches (not validation)."""
        return self.state_stage == "fit" and self._results is self._metrics.train

    @property
    def validating(self) -> bool:
        """True while a validation epoch runs (also inside fit)."""
        return self._results is not None and self._results.stage == "validate"

    @property
    def testing(self) -> bool:
        """True during test()."""
        return self.state_stage == "test"

    @property
    def predicting(self) -> bool:
        """True during predict()."""
        return self.state_stage == "predict"

    # ------------------------------------------------------------------ more of Lightning's Trainer members
    @property
    def state(self) -> TrainerState:
        """``.fn`` (the entry point called last), ``.stage`` (what runs now, ``None`` between entry points) and
        ``.status`` (running, finished or interrupted), with Lightning's values (:mod:`trainer.states`)."""
        if self.state_stage is None:
            stage = None
        elif self.sanity_checking:
            stage = RunningStage.SANITY_CHECKING
        elif self.validating:
            stage = RunningStage.VALIDATING
        else:
            stage = {"fit": RunningStage.TRAINING, "validate": RunningStage.VALIDATING, "test": RunningStage.TESTING,
                     "predict": RunningStage.PREDICTING}[self.state_stage]  # fmt: skip
        return TrainerState(status=self._status, fn=self._state_fn, stage=stage)

    @property
    def interrupted(self) -> bool:
        """True when the last fit/validate/test/predict ended early: an exception, a stop signal or Ctrl-C (after
        ``interrupted.ckpt`` was saved), or a non-finite loss (also under ``on_nonfinite_loss="warn"``); then
        ``state.status`` is ``"interrupted"``."""
        return self._status == TrainerStatus.INTERRUPTED

    @interrupted.setter
    def interrupted(self, value: bool) -> None:
        if value:
            self._status = TrainerStatus.INTERRUPTED

    @property
    def evaluating(self) -> bool:
        """True during validation (also inside fit and the sanity check) and test."""
        return self.sanity_checking or self.validating or self.testing

    @property
    def accelerator(self) -> Accelerator:
        """The kind of device used: ``CPUAccelerator``, ``CUDAAccelerator`` or ``MPSAccelerator``
        (:mod:`trainer.accelerators`)."""
        return accelerator_for(self.strategy.root_device.type)

    @property
    def device_ids(self) -> list[int]:
        """The device index of each process on this node (on the CPU: 0, 1, ... per process)."""
        devices = getattr(self.strategy, "parallel_devices", None) or [self.strategy.root_device]
        return [device.index if device.index is not None else i for i, device in enumerate(devices)]

    @property
    def num_devices(self) -> int:
        """Devices (processes) per node."""
        return len(self.device_ids)

    @property
    def precision_plugin(self) -> Any:
        """The strategy's precision plugin."""
        return self.strategy.precision

    @property
    def scaler(self) -> Any:
        """The ``16-mixed`` gradient scaler, else ``None``."""
        return getattr(self.strategy.precision, "scaler", None)

    @property
    def distributed_sampler_kwargs(self) -> Optional[dict[str, int]]:
        """``num_replicas``/``rank`` of the distributed samplers, ``None`` in a single process."""
        return self.strategy.distributed_sampler_kwargs

    @property
    def enable_validation(self) -> bool:
        """Whether fit validates: ``validation_step`` implemented, validation data given and batches allowed."""
        return bool(self._val_enabled)

    @property
    def early_stopping_callbacks(self) -> list[Callback]:
        """Every ``EarlyStopping`` callback."""
        from trainer.callbacks.early_stopping import EarlyStopping

        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> Optional[Callback]:
        """The first ``EarlyStopping`` callback, or ``None``."""
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def progress_bar_callback(self) -> Optional[Callback]:
        """The progress bar (``RichProgressBar`` or a user's ``ProgressBar``), or ``None``
        (``enable_progress_bar=False``)."""
        from trainer.callbacks.progress_bar import ProgressBar

        return next((cb for cb in self.callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def test_dataloaders(self) -> Any:
        """The test dataloader(s) of the running (or last) ``test``."""
        return data_utils.in_given_shape(*self._eval_data["test"][::2]) if "test" in self._eval_data else None

    @property
    def predict_dataloaders(self) -> Any:
        """The prediction dataloader(s) of the running (or last) ``predict``."""
        return data_utils.in_given_shape(*self._eval_data["predict"][::2]) if "predict" in self._eval_data else None

    @property
    def num_test_batches(self) -> list[float]:
        """Batches run per test dataloader."""
        return list(self._eval_data["test"][1]) if "test" in self._eval_data else []

    @property
    def num_predict_batches(self) -> list[float]:
        """Batches run per prediction dataloader."""
        return list(self._eval_data["predict"][1]) if "predict" in self._eval_data else []

    @property
    def num_sanity_val_batches(self) -> list[float]:
        """Batches the sanity check runs per validation dataloader."""
        steps = math.inf if self.num_sanity_val_steps == -1 else self.num_sanity_val_steps
        return [min(steps, limit) for limit in self._val_batch_limits]

    @property
    def is_last_batch(self) -> bool:
        """True while fit runs the last training batch of its epoch."""
        epoch_loop = self.fit_loop.epoch_loop
        return bool(epoch_loop is not None and epoch_loop.is_last_batch)

    @property
    def received_sigterm(self) -> bool:
        """True once this process got SIGTERM during fit (the fit then saves ``interrupted.ckpt`` and stops)."""
        return self._faults.signals.received == signal.SIGTERM

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    def __repr__(self) -> str:
        # Never raises, also for a Trainer whose __init__ failed half-way (pytest prints it in tracebacks).
        try:
            fields = ", ".join(f"{name}={self.__dict__[name]!r}" for name in ("strategy", "max_epochs", "max_steps")
                               if name in self.__dict__)  # fmt: skip
        except Exception:  # noqa: BLE001 - a repr must not raise
            fields = "..."
        return f"Trainer({fields})"


