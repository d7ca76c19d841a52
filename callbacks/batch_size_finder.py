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
from trainer.callbacks.trial_steps import TrialSteps, TunerExit
from trainer.strategies.errors import ConfigurationError


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
        if mode not in ("power", "binsearch"):
            raise ConfigurationError(f"BatchSizeFinder(mode={mode!r}) must be 'power' or 'binsearch' (`mode` should "
                                     "be either of ['power', 'binsearch']).")  # fmt: skip
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

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if trainer.global_step > 0:
            return  # resumed: the run already has its batch size
        loader = trainer.train_dataloader
        old = getattr(loader, "batch_size", None)
        size = self.find(trainer, module, loader)
        self.optimal_batch_size = size
        if trainer.is_global_zero:
            print(f"BatchSizeFinder: batch size {size} (trials: {self._trials_text()})")
        self._apply(trainer, module, loader, size)
        if old and size != old:
            scale_learning_rates(trainer, batch_scaling_factor(old, size, self.scale_lr))
        if self._early_exit:
            raise TunerExit()

    # ------------------------------------------------------------------ search
    def find(self, trainer: Any, module: Any, loader: Any) -> int:
        """Run the doubling and binary search; returns the largest batch size that fitted."""
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
        trials = TrialSteps(trainer, module)
        self.trials = {}
        try:
            good, bad = 0, None
            size = min(self.init_val, limit) if limit else self.init_val
            while len(self.trials) < self.max_trials:
                if self.fits(trials, module, loader, size):
                    good = size
                    if limit and size >= limit:
                        break
                    size = min(size * 2, limit) if limit else size * 2
                else:
                    bad = size
                    break
            while self.mode == "binsearch" and bad is not None and bad - good > 1 and len(self.trials) < self.max_trials:
                middle = (good + bad) // 2
                if self.fits(trials, module, loader, middle):
                    good = middle
                else:
                    bad = middle
        finally:
            trials.restore()
        if self.mode == "binsearch" and self.margin and good:
            good = max(1, int(good * (1 - self.margin)))
        if good == 0:
            raise RuntimeError(
                f"BatchSizeFinder: even batch size {self.init_val} does not fit ({self._trials_text()}). Lower "
                "init_val, raise max_memory_mb, or make the model smaller (e.g. precision='bf16-mixed')."
            )
        return good

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
    def _apply(self, trainer: Any, module: Any, loader: Any, size: int) -> None:
        name = self.batch_arg_name
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
            if in_hparams or as_attribute:  # every holder gets it, as in Lightning; the loader from the first
                record_hparam(owner, (name,), size)
                if new_loader is None:
                    new_loader = owner.train_dataloader()
        if getattr(new_loader, "batch_size", None) != size:
            new_loader = with_batch_size(loader, size)
        trainer.reset_train_dataloader(new_loader)


def _dataset_length(loader: Any) -> Optional[int]:
    dataset = getattr(loader, "dataset", None)
    if dataset is None or isinstance(dataset, IterableDataset):
        return None
    try:
        return len(dataset)
    except TypeError:
        return None
