"""``accelerate.utils`` names a training script imports, on this framework (``from trainer.accelerate.utils
import set_seed, find_executable_batch_size, ...``)."""
from __future__ import annotations

import functools
import gc
import inspect
import os
import random
from typing import Any, Callable, Optional

import torch

from trainer.engine.collectives import gather_object
from trainer.engine.wrappers import skip_first_batches
from trainer.engine.options import (
    AutocastKwargs, DataLoaderConfiguration, DDPCommunicationHookType, DistributedDataParallelKwargs,
    DistributedType, GradientAccumulationPlugin, GradScalerKwargs, InitProcessGroupKwargs, KwargsHandler,
    PrecisionType, ProfileKwargs, ProjectConfiguration,
)
from trainer.strategies.errors import ConfigurationError

__all__ = [
    "AutocastKwargs", "DataLoaderConfiguration", "DDPCommunicationHookType", "DistributedDataParallelKwargs",
    "DistributedType", "GradientAccumulationPlugin", "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler",
    "PrecisionType", "ProfileKwargs", "ProjectConfiguration", "find_executable_batch_size", "gather_object",
    "release_memory", "set_seed", "should_reduce_batch_size", "skip_first_batches", "is_bf16_available",
    "is_cuda_available", "is_datasets_available", "is_mlflow_available", "is_npu_available", "is_rich_available",
    "is_schedulefree_available", "is_tensorboard_available", "is_transformers_available", "is_wandb_available",
    "is_xpu_available", "tqdm",
]

# The messages of the out-of-memory errors find_executable_batch_size retries on (CUDA, cuDNN, CPU, HPU).
_OUT_OF_MEMORY = ("CUDA out of memory.", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
                  "DefaultCPUAllocator: can't allocate memory", "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed")  # fmt: skip


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed ``random``, NumPy and torch (every device) with ``seed``; ``device_specific`` adds this process's
    rank; ``deterministic`` turns on ``torch.use_deterministic_algorithms``. The same draws as Accelerate's."""
    if device_specific:
        seed += _rank()
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, shown on local rank 0 only unless ``main_process_only=False``."""
    from tqdm.auto import tqdm as bar

    if main_process_only:
        kwargs["disable"] = kwargs.get("disable", False) or int(os.environ.get("LOCAL_RANK", 0)) != 0
    return bar(*args, **kwargs)


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def is_schedulefree_available() -> bool:
    """True when the schedulefree package is installed."""
    return _installed("schedulefree")


def is_tensorboard_available() -> bool:
    """True when tensorboard (or tensorboardX) is installed."""
    return _installed("tensorboard") or _installed("tensorboardX")


def is_wandb_available() -> bool:
    """True when wandb is installed."""
    return _installed("wandb")


def is_mlflow_available() -> bool:
    """True when mlflow is installed."""
    return _installed("mlflow")


def is_rich_available() -> bool:
    """True when rich is installed."""
    return _installed("rich")


def is_datasets_available() -> bool:
    """True when Hugging Face datasets is installed."""
    return _installed("datasets")


def is_transformers_available() -> bool:
    """True when Hugging Face transformers is installed."""
    return _installed("transformers")


def is_cuda_available() -> bool:
    """True when a CUDA device can be used."""
    return torch.cuda.is_available()


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True when bfloat16 mixed precision can run: on a CUDA device that supports it, or on the CPU."""
    return torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True


def is_xpu_available(check_device: bool = False) -> bool:
    """True when an Intel XPU can be used."""
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_npu_available(check_device: bool = False) -> bool:
    """True when an Ascend NPU can be used (never here: torch_npu is not supported)."""
    return False


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True for an out-of-memory error, after which a smaller batch may fit."""
    if isinstance(exception, torch.cuda.OutOfMemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(message in str(exception.args[0]) for message in _OUT_OF_MEMORY)
    return False


def release_memory(*objects: Any) -> list[None]:
    """Collect garbage and empty the CUDA cache; returns a None per object, to assign over the references."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return [None] * len(objects)


def find_executable_batch_size(function: Optional[Callable[..., Any]] = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Optional[Callable[[], int]] = None) -> Callable[..., Any]:  # fmt: skip
    """Decorate ``function(batch_size, *args)``: call it with ``starting_batch_size`` and, each time it runs out
    of memory, again with a smaller batch (90% of the last, as Accelerate 1.x; or ``reduce_batch_size_fn()``),
    until it returns. Call the decorated function without the batch size. Reaching 0 raises ``RuntimeError``."""
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)  # fmt: skip
    batch_size = starting_batch_size

    def smaller() -> int:
        nonlocal batch_size
        batch_size = int(batch_size * 0.9)
        return batch_size

    reduce = reduce_batch_size_fn or smaller

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        release_memory()
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            passed = ", ".join(f"{name}={value}" for name, value in zip(params[1:], args[1:]))
            raise TypeError(f"The batch size was passed to `{function.__name__}` as its first argument; the "
                            f"decorator passes it. Call `{function.__name__}({passed})`.")  # fmt: skip
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - only out-of-memory errors are retried
                if not should_reduce_batch_size(error):
                    raise
                release_memory()
                batch_size = reduce() if reduce_batch_size_fn is None else reduce_batch_size_fn()

    return run
