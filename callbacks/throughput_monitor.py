"""``ThroughputMonitor``: samples/s, batches/s and how much of the training time is spent waiting for data."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator, Optional

from callbacks.callback import Callback
from callbacks.logging_steps import LoggingSteps
from strategies.rank import rank_zero_warn


def first_dim(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (1 when it holds none)."""
    while isinstance(batch, (list, tuple, dict)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 1


class ThroughputMonitor(Callback):
    """Measure training throughput and the share of training time spent in the dataloader's ``next()``.

    Logs ``throughput/samples_per_sec``, ``throughput/batches_per_sec`` and ``throughput/data_wait`` (a
    fraction) over each logging window, and keeps the whole fit's figures in :attr:`summary` (the end-of-fit
    report shows them). Validation time is not counted as training time.

    When, after at least ``min_batches`` batches, more than ``data_wait_threshold`` of the time went to
    waiting for batches, and at least ``min_wait_per_batch_s`` per batch (below that, worker processes
    cost more than they save), it warns once with concrete advice for the DataLoader.

    The timing wraps the training iterator through ``trainer.train_iterator_wrappers``, so without this
    callback the loop pays nothing for it. ``batch_size_fn(batch) -> int`` counts samples for batches
    whose first tensor's first dimension is not the batch size.
    """

    def __init__(
        self,
        batch_size_fn: Optional[Callable[[Any], int]] = None,
        data_wait_threshold: float = 0.2,
        min_wait_per_batch_s: float = 1e-3,
        min_batches: int = 20,
    ) -> None:
        self.batch_size_fn = batch_size_fn or first_dim
        self.data_wait_threshold = data_wait_threshold
        self.min_wait_per_batch_s = min_wait_per_batch_s
        self.min_batches = min_batches
        self.summary: dict[str, float] = {}
        self.warned = False
        self._steps = LoggingSteps()
        self._reset()

    def _reset(self) -> None:
        self.batches = 0
        self.samples = 0
        self.data_wait = 0.0
        self._train_time = 0.0
        self._segment_start: Optional[float] = None  # open while training batches run (not validation)
        self._in_epoch = False
        self._window = (0.0, 0, 0, 0.0)

    # ------------------------------------------------------------------ timing the data
    def _timed(self, iterator: Iterator[Any]) -> Iterator[Any]:
        clock = time.perf_counter
        size = self.batch_size_fn
        while True:
            start = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.data_wait += clock() - start
            self.batches += 1
            self.samples += size(batch)
            yield batch

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if stage == "fit":
            self._reset()
            self.summary = {}
            trainer.train_iterator_wrappers.append(self._timed)

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        if stage == "fit" and self._timed in trainer.train_iterator_wrappers:
            trainer.train_iterator_wrappers.remove(self._timed)

    # ------------------------------------------------------------------ training time, without validation
    def train_time(self) -> float:
        """Seconds spent running training batches so far in this fit."""
        if self._segment_start is None:
            return self._train_time
        return self._train_time + time.perf_counter() - self._segment_start

    def _close_segment(self) -> None:
        if self._segment_start is not None:
            self._train_time += time.perf_counter() - self._segment_start
            self._segment_start = None

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        self._in_epoch = True
        self._segment_start = time.perf_counter()

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self._close_segment()

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if self._in_epoch and not trainer.sanity_checking:
            self._segment_start = time.perf_counter()

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self._close_segment()
        self._in_epoch = False
        self._check_bottleneck(trainer)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._close_segment()  # max_steps may end training mid-epoch

    # ------------------------------------------------------------------ reporting
    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._steps.due(trainer):
            return
        now = (self.train_time(), self.batches, self.samples, self.data_wait)
        elapsed = now[0] - self._window[0]
        if elapsed > 0:
            module.log_dict({
                "throughput/samples_per_sec": (now[2] - self._window[2]) / elapsed,
                "throughput/batches_per_sec": (now[1] - self._window[1]) / elapsed,
                "throughput/data_wait": min((now[3] - self._window[3]) / elapsed, 1.0),
            }, on_step=True, on_epoch=False)  # fmt: skip
        self._window = now
        self._check_bottleneck(trainer)

    def totals(self) -> dict[str, float]:
        """The fit so far: ``samples_per_sec``, ``batches_per_sec``, ``data_wait_share``, ``batches``,
        ``samples``, ``train_time_s`` (empty before the first batch)."""
        elapsed = self.train_time()
        if elapsed <= 0 or not self.batches:
            return {}
        return {
            "samples_per_sec": self.samples / elapsed,
            "batches_per_sec": self.batches / elapsed,
            "data_wait_share": min(self.data_wait / elapsed, 1.0),
            "batches": float(self.batches),
            "samples": float(self.samples),
            "train_time_s": elapsed,
        }

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        self.summary = self.totals()

    def _check_bottleneck(self, trainer: Any) -> None:
        if self.warned or self.batches < self.min_batches:
            return
        elapsed = self.train_time()
        share = self.data_wait / elapsed if elapsed > 0 else 0.0
        per_batch = self.data_wait / self.batches
        if share > self.data_wait_threshold and per_batch >= self.min_wait_per_batch_s:
            self.warned = True
            rank_zero_warn(bottleneck_advice(share, per_batch, trainer.train_dataloader,
                                             trainer.strategy.root_device.type == "cuda"), stacklevel=2)  # fmt: skip


def bottleneck_advice(share: float, per_batch: float, loader: Any, on_cuda: bool) -> str:
    """The warning text: what was measured and what to change in the DataLoader."""
    workers = getattr(loader, "num_workers", None)
    cpus = os.cpu_count() or 1
    tips = []
    if workers is not None:
        if workers == 0:
            tips.append(f"load batches in background processes: DataLoader(num_workers={min(cpus, 8)}) "
                        f"(now 0; this machine has {cpus} CPUs)")  # fmt: skip
        else:
            tips.append(f"use more loader processes: num_workers is {workers}, this machine has {cpus} CPUs")
        if on_cuda and not getattr(loader, "pin_memory", False):
            tips.append("pin_memory=True, so host-to-GPU copies are faster and can overlap compute")
        if not getattr(loader, "persistent_workers", False):
            tips.append("persistent_workers=True (with num_workers > 0), so workers are not restarted every epoch")
    tips.append("make __getitem__ cheaper: pre-process once and cache, decode or augment on the GPU")
    return (
        f"Data loading is the bottleneck: training waited for the next batch {share:.0%} of the time "
        f"({per_batch * 1e3:.1f} ms per batch). Try: " + "; ".join(tips) + "."
    )
