"""``MemoryMonitor``: memory use logged at the Trainer's logging steps and summarised when fit ends."""
from __future__ import annotations

from typing import Any, Optional

from trainer.callbacks import memory_stats
from trainer.callbacks.callback import Callback
from trainer.callbacks.logging_steps import LoggingSteps
from trainer.callbacks.memory_stats import MB


class MemoryMonitor(Callback):
    """Log memory every ``log_every_n_steps`` steps (``memory/*`` in MB) and print the peaks at the end of fit.

    On every device: ``memory/rss_mb`` (the process's resident memory now) and ``memory/peak_rss_mb``
    (the highest it has been). On a CUDA device also, from PyTorch's caching allocator:

    - ``memory/cuda_allocated_mb`` (``torch.cuda.memory_allocated``): bytes held by live tensors now.
    - ``memory/cuda_max_allocated_mb`` (``torch.cuda.max_memory_allocated``): the peak of that since the
      process started: what decides whether a batch size fits.
    - ``memory/cuda_reserved_mb`` (``torch.cuda.memory_reserved``): what the allocator holds from the driver,
      live tensors plus its cache of freed blocks kept for reuse (and fragmentation).

    ``nvidia-smi`` shows more than ``reserved``: it counts everything the process took from the driver,
    which also includes the CUDA context (kernels, cuBLAS/cuDNN workspaces; often 300-1000 MB) and memory
    of libraries that bypass PyTorch's allocator (e.g. NCCL buffers). It also keeps showing the cache after
    tensors are freed, until ``torch.cuda.empty_cache()``. So nvidia-smi > reserved >= allocated is normal.
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose
        self._steps = LoggingSteps()
        self.peaks: dict[str, float] = {}

    def read(self, trainer: Any) -> dict[str, float]:
        """The current figures in MB (the same keys as logged)."""
        values: dict[str, float] = {}
        rss, peak = memory_stats.rss_bytes(), memory_stats.peak_rss_bytes()
        if rss is not None:
            values["memory/rss_mb"] = rss / MB
        if peak is not None:
            values["memory/peak_rss_mb"] = peak / MB
        for key, value in memory_stats.cuda_stats(trainer.strategy.root_device).items():
            values[f"memory/cuda_{key}_mb"] = value / MB
        for key, value in values.items():
            if value > self.peaks.get(key, -1.0):
                self.peaks[key] = value
        return values

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.read(trainer)

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._steps.due(trainer):
            module.log_dict(self.read(trainer), on_step=True, on_epoch=False)

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        self.read(trainer)
        if self.verbose and trainer.is_global_zero:
            print(self.summary())

    def summary(self) -> str:
        """One line with the peaks seen during fit."""
        parts = []
        peak_rss: Optional[float] = self.peaks.get("memory/peak_rss_mb")
        if peak_rss is not None:
            parts.append(f"peak RSS {memory_stats.format_bytes(peak_rss * MB)}")
        if "memory/cuda_max_allocated_mb" in self.peaks:
            allocated, reserved = self.peaks["memory/cuda_max_allocated_mb"], self.peaks["memory/cuda_reserved_mb"]
            parts.append(f"CUDA max allocated {memory_stats.format_bytes(allocated * MB)}")
            parts.append(f"CUDA reserved up to {memory_stats.format_bytes(reserved * MB)}")
        return "Memory: " + (", ".join(parts) if parts else "not measurable on this platform")
