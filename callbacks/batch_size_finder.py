"""``BatchSizeFinder``: the largest batch size that fits, found before training starts."""
from __future__ import annotations

import gc
import itertools
import warnings
from typing import Any, Optional, Union

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer.callbacks.callback import Callback
from trainer.callbacks.lr_scaling import batch_scaling_factor, record_hparam, scale_learning_rates
from trainer.callbacks.trial_steps import EvalTrialSteps, TrialSteps, TunerExit
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_info, rank_zero_warn


_OOM_MARKERS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_SUPPORTED",
                "DefaultCPUAllocator: can't allocate memory")


def is_out_of_memory(err: BaseException) -> bool:
    """True for CUDA/cuDNN/cuBLAS allocation failures (and the CPU allocator's)."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(marker in text for marker in _OOM_MARKERS)


def with_batch_size(loader: Any, batch_size: int, num_workers: Optional[int] = None) -> DataLoader:
    """A copy of ``loader`` (same dataset, sampler, collate function, workers) with another batch size."""
    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        raise ConfigurationError(
            "BatchSizeFinder needs a torch DataLoader built with batch_size=... (not a custom batch_sampler), "
            "or a module/datamodule attribute `batch_size` that its train_dataloader() reads."
        )
    workers = loader.num_workers if num_workers is None else num_workers
    iterable = isinstance(loader.dataset, IterableDataset)
    return DataLoader(
        loader.dataset, batch_size=batch_size, sampler=None if iterable else loader.sampler,
        num_workers=workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
        timeout=loader.timeout if workers else 0, worker_init_fn=loader.worker_init_fn, generator=loader.generator,
        persistent_workers=loader.persistent_workers and workers > 0,
        prefetch_factor=loader.prefetch_factor if workers else None,
    )  # fmt: skip


class ActivationMeter:
    """Bytes of tensors autograd saves for backward (activations, and the batch where saved), not counting
    parameters: the memory that grows with the batch size. Works on any device."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self._seen: set[int] = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._params and ptr not in self._seen:
            self._seen.add(ptr)
            self.bytes += storage.nbytes()
        return tensor

    def __enter__(self) -> "ActivationMeter":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


class BatchSizeFinder(Callback):
    """Find the largest training batch size that fits, at the start of fit, and train with it.

    From ``init_val``, the batch size doubles until a trial fails, then (``mode="binsearch"``, the default) a
    binary search between the last size that fitted and the first that did not finds the largest that fits
    (at most ``max_trials`` trials; never more than the dataset); ``mode="power"`` keeps the last size that fitted. A trial runs ``steps_per_trial`` full training steps (forward,
    backward, optimizer step); all their effects are undone afterwards. A trial fails when:

    - on CUDA, it runs out of memory (the error is caught and the cache emptied), or its peak memory
      beyond what was allocated before it exceeds ``max_memory_mb``;
    - on CPU (where running out of memory means swapping or being killed), the memory autograd keeps for
      backward (activations, not parameters) exceeds ``max_memory_mb``; without it (as in Lightning) no trial
      fails there, and the search ends at ``max_val`` (8192 by default), the dataset's length or ``max_trials``.

    The result is stored in :attr:`optimal_batch_size`, set on a module/datamodule attribute (and
    hyperparameter) named ``batch_arg_name`` when there is one, and the training data is rebuilt with it.
    ``scale_lr=True`` (or ``"linear"``/``"sqrt"``) scales learning rates for the change, see
    :mod:`trainer.callbacks.lr_scaling`. Single device only; runs only on a fresh fit, not when resuming.
    """

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(
        self,
        init_val: int = 2,
        max_trials: int = 25,
        steps_per_trial: int = 3,
        max_memory_mb: Optional[float] = None,
        max_val: Optional[int] = 8192,
        scale_lr: Union[bool, str] = False,
        batch_arg_name: str = "batch_size",
        mode: str = "binsearch",
        margin: float = 0.0,
    ) -> None:
        if init_val < 1 or max_trials < 0 or steps_per_trial < 1:
            raise ConfigurationError(
                "BatchSizeFinder: init_val and steps_per_trial must be >= 1, max_trials >= 0 (0: keep init_val)."
            )
        if mode not in self.SUPPORTED_MODES:
            raise ConfigurationError(f"BatchSizeFinder(mode={mode!r}): `mode` should be either of {self.SUPPORTED_MODES} "
                                     "(doubling only, or doubling then a binary search).")  # fmt: skip
        self.mode = mode
        if not 0.0 <= margin < 1.0:
            raise ConfigurationError(f"BatchSizeFinder(margin={margin}) must be in [0, 1).")
        self.margin = margin  # binsearch: keep this fraction below the largest size that fitted
        batch_scaling_factor(1, 1, scale_lr)  # validates scale_lr now, not after the search
        self.init_val = init_val
        self.max_trials = max_trials
        self.steps_per_trial = steps_per_trial
        self.max_memory_mb = max_memory_mb
        self.max_val = max_val
        self.scale_lr = scale_lr
        self.batch_arg_name = batch_arg_name
        self.optimal_batch_size: Optional[int] = None
        self.trials: dict[int, Optional[float]] = {}  # batch size → measured MB (None: out of memory)
        self._early_exit = False  # set by trainer.tuner.Tuner: end the fit after the search

    def setup(self, trainer: Any, module: Any, stage: Optional[str] = None) -> None:
        """Refuse distributed runs before anything starts (Lightning's check; ``stage`` may be left out)."""
        if trainer.world_size > 1:
            raise ConfigurationError("The Batch size finder is not supported with distributed strategies (several "
                                     "processes): tune on one device (devices=1), then train with what it finds.")  # fmt: skip

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if trainer.global_step > 0:
            return  # resumed: the run already has its batch size
        self.scale_batch_size(trainer, module)

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        if trainer.sanity_checking or trainer.state.fn != "validate":
            return  # fit's validation uses the batch size found at the start of fit
        self.scale_batch_size(trainer, module)

    def on_test_start(self, trainer: Any, module: Any) -> None:
        self.scale_batch_size(trainer, module)

    def on_predict_start(self, trainer: Any, module: Any) -> None:
        self.scale_batch_size(trainer, module)

    def scale_batch_size(self, trainer: Any, module: Any) -> None:
        """Search, set the result on the module/datamodule and run the stage with it: in fit with training steps
        (from ``on_fit_start``), in validate/test/predict with that stage's steps (from its start hook). As in
        Lightning, a subclass may call it from another hook (e.g. ``on_train_epoch_start`` to search again)."""
        if trainer.fast_dev_run:  # as in Lightning: no search, no result, the quick check goes on
            rank_zero_warn("Skipping batch size scaler since `fast_dev_run` is enabled: fast_dev_run runs only a few "
                           "batches to check the code; the batch size is unchanged.")
            self.optimal_batch_size = None
            if self._early_exit:
                raise TunerExit()
            return
        stage = str(trainer.state.fn)
        loader = trainer.train_dataloader if stage == "fit" else _single_eval_loader(trainer, stage)
        old = getattr(loader, "batch_size", None)
        size = self.find(trainer, module, loader, stage)
        self.optimal_batch_size = size
        if trainer.is_global_zero:
            print(f"BatchSizeFinder: batch size {size} (trials: {self._trials_text()})")
        self._apply(trainer, module, loader, size, stage)
        if stage == "fit" and old and size != old:
            scale_learning_rates(trainer, batch_scaling_factor(old, size, self.scale_lr))
        if self._early_exit:
            raise TunerExit()

    # ------------------------------------------------------------------ search
    def find(self, trainer: Any, module: Any, loader: Any, stage: str = "fit") -> int:
        """Run the doubling and binary search with batches of ``loader``; returns the largest batch size that fitted.
        A trial runs ``stage``'s steps: training steps for ``"fit"``, else those of validate, test or predict."""
        device = trainer.strategy.root_device
        length = _dataset_length(loader)
        limit = min(self.max_val, length) if self.max_val and length else (self.max_val or length)
        if device.type != "cuda" and self.max_memory_mb is None and not limit:
            raise ConfigurationError(
                f"BatchSizeFinder on {device.type} with max_val=None and a dataset without a length: nothing bounds "
                "the search (only CUDA reports running out of memory safely). Pass max_val=... or max_memory_mb=... "
                "(the activation memory a batch may use)."
            )
        if self.max_trials == 0:
            return min(self.init_val, limit) if limit else self.init_val
        trials = TrialSteps(trainer, module) if stage == "fit" else EvalTrialSteps(trainer, module, stage)
        self.trials = {}
        try:
            good = self._search(trials, module, loader, limit, length)
        finally:
            trials.restore()
        if self.mode == "binsearch" and self.margin and good:
            reduced = max(1, int(good * (1 - self.margin)))
            if reduced != good:
                rank_zero_info(f"Applying margin of {self.margin:.1%}, reducing batch size from {good} to {reduced}")
            good = reduced
        if good == 0:
            raise RuntimeError(
                f"BatchSizeFinder: even batch size {self.init_val} does not fit ({self._trials_text()}). Lower "
                "init_val, raise max_memory_mb, or make the model smaller (e.g. precision='bf16-mixed')."
            )
        return good

    def _search(self, trials: Any, module: Any, loader: Any, limit: Optional[int], length: Optional[int]) -> int:
        """Double from ``init_val`` until a trial fails or ``limit`` is reached, then (binsearch) bisect between the
        last size that fitted and the first that did not, within ``max_trials`` trials. Says each step, as
        Lightning does, at INFO level."""
        good, bad = 0, None
        size = min(self.init_val, limit) if limit else self.init_val
        while True:
            if self.fits(trials, module, loader, size):
                good = size
                if limit and size >= limit:
                    rank_zero_info(f"The batch size {size} is greater or equal than the length of your dataset: "
                                   f"{length}." if limit == length else
                                   f"Reached the maximum batch size limit of {limit}. Stopping search.")  # fmt: skip
                    return good
                following = (good + bad) // 2 if bad is not None else min(size * 2, limit) if limit else size * 2
            else:
                bad = size
                if self.mode == "power":
                    return good
                following = (good + bad) // 2
            if (bad is not None and bad - good <= 1) or len(self.trials) >= self.max_trials:
                return good
            rank_zero_info(f"Batch size {size} {'succeeded' if good == size else 'failed'}, trying batch size "
                           f"{following}")  # fmt: skip
            size = following

    def measure(self, trials: TrialSteps, module: Any, loader: Any, size: int) -> Optional[float]:
        """MB a trial at ``size`` used (see the class docstring), or ``None`` when it ran out of memory."""
        device = trials.strategy.root_device
        batches = list(itertools.islice(with_batch_size(loader, size, num_workers=0), self.steps_per_trial))
        cuda = device.type == "cuda"
        try:
            if cuda:
                torch.cuda.synchronize(device)
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            saved = 0
            for batch in batches:
                with ActivationMeter(module) as meter:
                    trials.step(batch)
                saved = max(saved, meter.bytes)
            used = (torch.cuda.max_memory_allocated(device) - base) if cuda else saved
            return used / 2**20
        except RuntimeError as err:
            if not is_out_of_memory(err):
                raise
            return None
        finally:
            del batches
            trials.discard()
            if cuda:
                gc.collect()
                torch.cuda.empty_cache()

    def fits(self, trials: TrialSteps, module: Any, loader: Any, size: int) -> bool:
        """One trial: True when ``size`` ran without running out of memory and within ``max_memory_mb``."""
        used = self.measure(trials, module, loader, size)
        self.trials[size] = used
        return used is not None and (self.max_memory_mb is None or used <= self.max_memory_mb)

    def _trials_text(self) -> str:
        return ", ".join(f"{size}: {'OOM' if mb is None else f'{mb:.3g} MB'}" for size, mb in self.trials.items())

    # ------------------------------------------------------------------ applying the result
    def _apply(self, trainer: Any, module: Any, loader: Any, size: int, stage: str) -> None:
        """Set ``size`` on every holder of ``batch_arg_name`` (module and datamodule, attribute and hparams, as in
        Lightning) and run the stage on a loader with it: requested again from the first holder that gives one
        (fit: its validation loaders too), else a copy of ``loader`` with the new batch size."""
        name = self.batch_arg_name
        source = _LOADER_HOOKS[stage]
        new_loader = None
        for owner in (trainer.datamodule, module):
            if owner is None:
                continue
            in_hparams = name in getattr(owner, "hparams", {})
            as_attribute = hasattr(owner, name) and not callable(getattr(owner, name))
            if owner is module and in_hparams and as_attribute:
                warnings.warn(
                    f"Field `model.{name}` and `model.hparams.{name}` are mutually exclusive! `model.{name}` will be "
                    "used as the initial batch size for scaling. If this is not the intended behavior, please remove "
                    "either one.", UserWarning, stacklevel=2,
                )  # fmt: skip
            if in_hparams or as_attribute:
                record_hparam(owner, (name,), size)
                if new_loader is None:
                    new_loader = getattr(owner, source)()
        if getattr(new_loader, "batch_size", None) != size:
            new_loader = with_batch_size(loader, size)
        if stage == "fit":
            trainer.reset_train_dataloader(new_loader)
            trainer.reset_val_dataloader()  # they may read the batch size too, as Lightning reloads them here
        else:
            trainer.reset_eval_dataloader(new_loader)


_LOADER_HOOKS = {"fit": "train_dataloader", "validate": "val_dataloader", "test": "test_dataloader",
                 "predict": "predict_dataloader"}  # fmt: skip
_LOADER_PREFIX = {"validate": "val", "test": "test", "predict": "predict"}


def _single_eval_loader(trainer: Any, stage: str) -> Any:
    """The one loader validate/test/predict runs on; the finder cannot search over several (as in Lightning)."""
    loaders = getattr(trainer, f"{_LOADER_PREFIX[stage]}_dataloaders")
    several = isinstance(loaders, (list, tuple, dict))
    if several and len(loaders) == 1:
        return next(iter(loaders.values())) if isinstance(loaders, dict) else loaders[0]
    if several:
        raise ConfigurationError(
            f"The Batch size finder cannot be used with multiple {_LOADER_PREFIX[stage]} dataloaders ({len(loaders)} "
            f"here): run {stage}() with one to search, or set the batch size yourself."
        )
    return loaders


def _dataset_length(loader: Any) -> Optional[int]:
    dataset = getattr(loader, "dataset", None)
    if dataset is None or isinstance(dataset, IterableDataset):
        return None
    try:
        return len(dataset)
    except TypeError:
        return None
