"""``FitReport``: a table at the end of fit with what a run's owner asks first: how long, how fast, how big,
and where the best checkpoint is."""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Optional

from trainer.callbacks import memory_stats
from trainer.callbacks.callback import Callback
from trainer.callbacks.throughput_monitor import ThroughputMonitor


class FitReport(Callback):
    """Print a rich table when fit ends (global rank 0): duration, epochs and optimizer steps, throughput,
    data-wait share, compute (TFLOP/s and MFU), peak memory, the best checkpoint and the 16-mixed steps skipped for inf/nan gradients.

    Throughput in samples/s (and tokens/s), the data-wait share, TFLOP/s and MFU come from a
    :class:`ThroughputMonitor` when one is among the callbacks; otherwise optimizer steps per second are shown. Added by default with the progress
    bar (``enable_progress_bar=True``). The rows are kept in :attr:`rows`.
    """

    def __init__(self, console: Any = None) -> None:
        self.console = console
        self.rows: list[tuple[str, str]] = []
        self._fit_start = 0.0
        self._train_start: Optional[float] = None
        self._train_end: Optional[float] = None
        self._steps_at_train_start = 0  # a resumed fit starts at the checkpoint's step

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        self._fit_start = time.monotonic()
        self._train_start = self._train_end = None

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self._train_start = time.monotonic()
        self._steps_at_train_start = trainer.global_step

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._train_end = time.monotonic()

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        if not trainer.is_global_zero:
            return
        self.rows = self.collect(trainer)
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Fit report", title_justify="left", show_header=False, box=None, padding=(0, 2))
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for label, value in self.rows:
            table.add_row(label, value)
        console = self.console if self.console is not None else Console()
        if not console.is_terminal:  # a log file: widen so paths stay whole and can be copied into ckpt_path=
            widest = max(len(label) for label, _ in self.rows) + max(len(value) for _, value in self.rows)
            console.width = max(console.width, widest + 10)  # + the table's padding
        console.print(table)

    def collect(self, trainer: Any) -> list[tuple[str, str]]:
        """The report's ``(label, value)`` rows."""
        now = time.monotonic()
        steps = trainer.global_step - self._steps_at_train_start  # run in this fit, not restored
        start = self._steps_at_train_start
        resumed = f" ({steps} in this run, resumed at step {start})" if start else ""
        rows = [("Duration", _clock(now - self._fit_start)),
                ("Epochs / steps", f"{_plural(trainer.current_epoch, 'epoch')}, "
                                   f"{_plural(trainer.global_step, 'optimizer step')}{resumed}")]  # fmt: skip
        monitor = next((cb for cb in trainer.callbacks if isinstance(cb, ThroughputMonitor)), None)
        totals = monitor.totals() if monitor is not None else {}
        if totals:
            rate = f"{totals['samples_per_sec']:,.1f} samples/s, {totals['batches_per_sec']:,.2f} batches/s"
            rows.append(("Throughput", rate))
            if "tokens_per_sec" in totals:
                rows[-1] = ("Throughput", f"{rate}, {totals['tokens_per_sec']:,.0f} tokens/s")
            rows.append(("Data wait", f"{totals['data_wait_share']:.1%} of training time"))
            if "tflops_per_sec" in totals:
                rows.append(("Compute", _compute(totals, monitor.peak)))
        else:
            train_time = (self._train_end or now) - (self._train_start or now)
            if train_time > 0:
                rate = f"{steps / train_time:,.2f} optimizer steps/s (incl. validation)"
                rows.append(("Throughput", rate))
            rows.append(("Data wait", "not measured (add trainer.callbacks.ThroughputMonitor())"))
        memory = []
        cuda = memory_stats.cuda_stats(trainer.strategy.root_device)
        if cuda:
            memory.append(f"CUDA max allocated {memory_stats.format_bytes(cuda['max_allocated'])}")
        peak_rss = memory_stats.peak_rss_bytes()
        if peak_rss is not None:
            memory.append(f"process peak RSS {memory_stats.format_bytes(peak_rss)}")
        rows.append(("Peak memory", ", ".join(memory) or "-"))
        callback = trainer.checkpoint_callback  # None without checkpointing: every getattr falls back
        best = getattr(callback, "best_model_path", "") or "-"
        score, monitor = getattr(callback, "best_model_score", None), getattr(callback, "monitor", None)
        if best != "-" and score is not None and monitor:
            best += f" ({monitor}={float(score):.4g})"
        rows.append(("Best checkpoint", best))
        rows.append(("Skipped fp16 steps", str(trainer.skipped_steps)))
        return rows


def _compute(totals: dict[str, float], peak: Optional[tuple[float, str]]) -> str:
    text = f"{totals['tflops_per_sec']:,.3g} TFLOP/s per device ({totals['flops_per_batch'] / 1e9:,.3g} GFLOP per batch)"
    if peak is None:
        return text + ", MFU unknown (pass ThroughputMonitor(peak_flops=...))"
    return text + f", MFU {totals['mfu']:.1%} of {peak[0] / 1e12:,.4g} TFLOP/s ({peak[1]})"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))
