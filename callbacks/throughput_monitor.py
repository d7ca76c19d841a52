"""``ThroughputMonitor``: samples/s, tokens/s, TFLOP/s, MFU, and how much of the training time is spent waiting
for data."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator, Optional

from trainer.callbacks.callback import Callback
from trainer.callbacks.flops import BatchFlopCounter, device_peak_flops
from trainer.callbacks.logging_steps import LoggingSteps
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_warn

_END = object()


def first_dim(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (1 when it holds none)."""
    while isinstance(batch, (list, tuple, dict)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 1


class ThroughputMonitor(Callback):
    """Measure training throughput, compute utilisation and the share of training time spent in the dataloader.

    Logs, over each logging window, ``throughput/samples_per_sec``, ``throughput/batches_per_sec``,
    ``throughput/data_wait`` (a fraction), ``throughput/tokens_per_sec`` (when the module's
    ``tokens_in_batch(batch)`` returns a count), ``throughput/tflops_per_sec`` (this device's) and
    ``throughput/mfu`` (model FLOPs utilisation: achieved over peak FLOP/s); the whole fit's figures are in
    :attr:`summary` (the end-of-fit report shows them). Validation time is not counted as training time.

    FLOPs are counted once per fit, on the first training batch (:class:`trainer.callbacks.flops.BatchFlopCounter`:
    forward and backward under ``torch.utils.flop_counter``), then scaled by the samples each window ran; after
    that the cost per batch is a few counters. ``count_flops=False`` skips it. The peak comes from
    :data:`trainer.callbacks.flops.PEAK_FLOPS` for the GPU and precision in use, or from ``peak_flops`` (FLOP/s per
    device, e.g. ``989e12``), which the CPU needs for an MFU figure.

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
        count_flops: bool = True,
        peak_flops: Optional[float] = None,
    ) -> None:
        if peak_flops is not None and (isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float))
                                       or peak_flops <= 0):  # fmt: skip
            raise ConfigurationError(f"ThroughputMonitor(peak_flops={peak_flops!r}) must be a FLOP/s figure > 0, e.g. 989e12.")
        self.batch_size_fn = batch_size_fn or first_dim
        self.data_wait_threshold = data_wait_threshold
        self.min_wait_per_batch_s = min_wait_per_batch_s
        self.min_batches = min_batches
        self.count_flops = bool(count_flops)
        self.peak_flops = peak_flops
        self.summary: dict[str, float] = {}
        self.warned = False
        #: FLOPs of the first training batch, and per sample of it (``None`` until counted).
        self.flops_per_batch: Optional[int] = None
        self.flops_per_sample: Optional[float] = None
        #: The peak used for MFU (FLOP/s per device) and where it came from, e.g. "H100 SXM bf16".
        self.peak: Optional[tuple[float, str]] = None
        self._counter: Optional[BatchFlopCounter] = None
        self._first_samples = 1
        self._tokens_fn: Optional[Callable[[Any], Any]] = None
        self._steps = LoggingSteps()
        self._reset()

    def _reset(self) -> None:
        self.batches = 0
        self.samples = 0
        self.data_wait = 0.0
        self._train_time = 0.0
        self.tokens = 0
        self._segment_start: Optional[float] = None  # open while training batches run (not validation)
        self._in_epoch = False
        self._window = (0.0, 0, 0, 0.0, 0)

    # ------------------------------------------------------------------ timing the data
    def _timed(self, iterator: Iterator[Any]) -> Iterator[Any]:
        clock = time.perf_counter
        size = self.batch_size_fn
        if not self.batches:  # the fit's first batch: find the token count, count its FLOPs
            start = clock()
            batch = next(iterator, _END)
            if batch is _END:
                return
            self.data_wait += clock() - start
            self.batches = 1
            self.samples = samples = size(batch)
            tokens = self._tokens_fn(batch) if self._tokens_fn is not None else None
            if tokens is None:
                self._tokens_fn = None
            else:
                self.tokens = int(tokens)
            if self.count_flops and self.flops_per_batch is None:
                self._counter = BatchFlopCounter()
                self._counter.start()  # stopped in on_train_batch_end
                self._first_samples = samples
            yield batch
        tokens_fn = self._tokens_fn
        while True:
            start = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.data_wait += clock() - start
            self.batches += 1
            self.samples += size(batch)
            if tokens_fn is not None:
                self.tokens += int(tokens_fn(batch))
            yield batch

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if stage == "fit":
            self._reset()
            self.summary = {}
            self.flops_per_batch = self.flops_per_sample = None
            tokens_fn = getattr(module, "tokens_in_batch", None)
            self._tokens_fn = tokens_fn if callable(tokens_fn) else None
            self.peak = (float(self.peak_flops), "peak_flops argument") if self.peak_flops is not None else \
                device_peak_flops(trainer.strategy.root_device, trainer.precision)  # fmt: skip
            trainer.train_iterator_wrappers.append(self._timed)

    def _stop_counting(self) -> None:
        counter, self._counter = self._counter, None
        if counter is not None and counter.running:
            self.flops_per_batch = counter.stop()
            self.flops_per_sample = self.flops_per_batch / max(self._first_samples, 1)

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        self._stop_counting()  # a fit that ended inside its first batch
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
        self._stop_counting()  # the first batch ended its epoch without a batch end (on_train_batch_start gave -1)
        self._close_segment()
        self._in_epoch = False
        self._check_bottleneck(trainer)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._close_segment()  # max_steps may end training mid-epoch
        self._stop_counting()

    # ------------------------------------------------------------------ reporting
    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._counter is not None:
            self._stop_counting()
        if not self._steps.due(trainer):
            return
        now = (self.train_time(), self.batches, self.samples, self.data_wait, self.tokens)
        elapsed = now[0] - self._window[0]
        if elapsed > 0:
            module.log_dict(self._rates(elapsed, now[1] - self._window[1], now[2] - self._window[2],
                                        now[3] - self._window[3], now[4] - self._window[4], "throughput/"),
                            on_step=True, on_epoch=False)  # fmt: skip
        self._window = now
        self._check_bottleneck(trainer)

    def _rates(self, elapsed: float, batches: int, samples: int, data_wait: float, tokens: int,
               prefix: str = "") -> dict[str, float]:  # fmt: skip
        rates = {
            f"{prefix}samples_per_sec": samples / elapsed,
            f"{prefix}batches_per_sec": batches / elapsed,
            f"{prefix}data_wait": min(data_wait / elapsed, 1.0),
        }
        if self._tokens_fn is not None:
            rates[f"{prefix}tokens_per_sec"] = tokens / elapsed
        if self.flops_per_sample is not None:
            flops_per_sec = self.flops_per_sample * samples / elapsed
            rates[f"{prefix}tflops_per_sec"] = flops_per_sec / 1e12
            if self.peak is not None:
                rates[f"{prefix}mfu"] = flops_per_sec / self.peak[0]
        return rates

    def totals(self) -> dict[str, float]:
        """The fit so far: ``samples_per_sec``, ``batches_per_sec``, ``data_wait_share``, ``batches``,
        ``samples``, ``train_time_s``, and when known ``tokens_per_sec``, ``flops_per_batch``, ``tflops_per_sec``
        (this device) and ``mfu`` (empty before the first batch). The first batch's time (FLOP counting,
        compilation) is included."""
        elapsed = self.train_time()
        if elapsed <= 0 or not self.batches:
            return {}
        totals = self._rates(elapsed, self.batches, self.samples, self.data_wait, self.tokens)
        totals["data_wait_share"] = totals.pop("data_wait")
        totals.update(batches=float(self.batches), samples=float(self.samples), train_time_s=elapsed)
        if self.flops_per_batch is not None:
            totals["flops_per_batch"] = float(self.flops_per_batch)
        return totals

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
