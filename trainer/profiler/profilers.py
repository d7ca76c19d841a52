"""``Trainer(profiler=...)``: where a run's time goes.

``"simple"`` (:class:`SimpleProfiler`) prints, when a stage ends, the mean, total and share of time of each phase
(waiting for data, ``training_step``, backward, the optimizer step, each callback and module hook, logging,
checkpointing, validation). ``"pytorch"`` (:class:`PyTorchProfiler`) runs ``torch.profiler`` over a
wait/warmup/active schedule of training batches and writes one Chrome-trace file per rank, which TensorBoard's
profiler plugin and https://ui.perfetto.dev open; the same phases appear in it as named ranges. A
:class:`Profiler` subclass gets the same ``start``/``stop`` calls.

Off by default, and then free: the Trainer's loop has no profiling code. A profiler is attached to a stage by
:mod:`trainer.profiler.instrumentation`, which wraps the calls the loop already makes, for that stage only.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from trainer.strategies.errors import ConfigurationError


class Profiler:
    """Base class: the Trainer calls :meth:`start`/:meth:`stop` around each phase, :meth:`step` before each
    training batch, :meth:`setup`/:meth:`teardown` around a stage. Phases nest (a checkpoint is saved inside a
    callback hook). Subclasses override what they need; ``summary()`` is printed on global rank 0 at a stage's end.
    """

    def setup(self, trainer: Any, stage: str) -> None:
        """Called when a stage (fit, validate, test, predict) begins, before anything is timed."""

    def start(self, action: str) -> None:
        """A phase named ``action`` begins."""

    def stop(self, action: str) -> None:
        """The innermost running phase, named ``action``, ends."""

    @contextlib.contextmanager
    def profile(self, action: str) -> Iterator[None]:
        """``with profiler.profile("name"):`` times a block of your own as a phase."""
        self.start(action)
        try:
            yield
        finally:
            self.stop(action)

    def step(self) -> None:
        """A training batch is about to be fetched."""

    def summary(self) -> str:
        """What to print at the end of a stage (empty: nothing)."""
        return ""

    def teardown(self, trainer: Any, stage: str) -> None:
        """Called when a stage ends (also after a failure)."""


class SimpleProfiler(Profiler):
    """Wall-clock time per phase: calls, mean, total and percent of the stage's loop time.

    Times are exclusive: a phase's nested phases (a checkpoint saved in a callback hook) are counted in their own
    row, not again in their parent's, so the rows add up to the stage's time; the "... loop (own code)" rows are
    the loops' own code, between the phases. On CUDA each boundary synchronises the device (``sync_cuda``), so GPU work is charged to the phase
    that launched it rather than to the next one that waits for it; this slows the run a little.

    ``results`` maps each phase to ``(calls, total_seconds)`` after a stage (kept until the next one starts);
    ``recorded_durations`` (Lightning's name) each phase to the seconds of every call, in order.

    As in Lightning, ``filename`` also writes each stage's summary to ``<dirpath>/<stage>-<filename>.txt``
    (``-<rank>`` appended with several processes; ``dirpath`` defaults to ``trainer.log_dir``), and
    ``extended=False`` leaves out the calls and percent columns.
    """

    def __init__(
        self,
        dirpath: Union[str, Path, None] = None,
        filename: Optional[str] = None,
        extended: bool = True,
        sync_cuda: bool = True,
    ) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self.extended = extended
        self.sync_cuda = sync_cuda
        self.results: dict[str, tuple[int, float]] = {}
        self._stack: list[list[Any]] = []  # [action, start, time spent in nested phases]
        self._totals: dict[str, list[float]] = {}
        self.recorded_durations: dict[str, list[float]] = {}
        self._sync: Any = None
        self._stage = ""
        self._rank: Optional[int] = None

    def setup(self, trainer: Any, stage: str) -> None:
        import torch

        device = trainer.strategy.root_device
        self._sync = (lambda: torch.cuda.synchronize(device)) if self.sync_cuda and device.type == "cuda" else None
        self._stack, self._totals, self.results, self._stage = [], {}, {}, stage
        self.recorded_durations = {}
        if self.dirpath is None:
            self.dirpath = trainer.log_dir
        self._rank = trainer.global_rank if trainer.world_size > 1 else None

    def start(self, action: str) -> None:
        if self._sync is not None:
            self._sync()
        if any(entry[0] == action for entry in self._stack):
            raise ValueError(f"Attempted to start {action} which has already started.")
        self._stack.append([action, time.perf_counter(), 0.0])

    def stop(self, action: str) -> None:
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        if not self._stack or self._stack[-1][0] != action:
            running = repr(self._stack[-1][0]) if self._stack else "none"
            raise ValueError(f"Attempting to stop recording an action ({action}) which was never started, or is not "
                             f"the running phase (running: {running}).")  # fmt: skip
        name, started, nested = self._stack.pop()
        elapsed = now - started
        if self._stack:
            self._stack[-1][2] += elapsed
        entry = self._totals.setdefault(action, [0, 0.0])
        entry[0] += 1
        entry[1] += elapsed - nested
        self.recorded_durations.setdefault(action, []).append(elapsed - nested)

    def teardown(self, trainer: Any, stage: str) -> None:
        while self._stack:  # a failure left phases open
            self.stop(self._stack[-1][0])
        self.results = {name: (int(calls), total) for name, (calls, total) in self._totals.items()}
        self._sync = None  # keeps the profiler picklable (ddp_spawn sends the Trainer to each stage's processes)
        if self.filename and self.dirpath is not None:
            folder = Path(self.dirpath)
            folder.mkdir(parents=True, exist_ok=True)
            suffix = "" if self._rank is None else f"-{self._rank}"
            name = f"{stage}-{self.filename}" if trainer is not None else self.filename
            (folder / f"{name}{suffix}.txt").write_text(self.summary() + "\n", encoding="utf-8")

    def describe(self) -> None:
        """Print the report of what was recorded so far (and write it to ``<dirpath>/<filename>.txt`` when given),
        for a profiler used on its own, outside a Trainer (Lightning's ``describe``)."""
        if self._stack or self._totals:
            self.teardown(None, self._stage or "profile")
        summary = self.summary()
        if summary:
            print(summary)

    def total_time(self) -> float:
        """Seconds of the stage's loop: the sum of every row."""
        return sum(total for _, total in self.results.values())

    def summary(self) -> str:
        if not self.results:
            return ""
        from rich.console import Console
        from rich.table import Table

        overall = self.total_time() or 1.0
        table = Table(title=f"Profile of {self._stage} (exclusive wall time)", title_justify="left")
        columns = ("phase", "calls", "mean", "total", "percent") if self.extended else ("phase", "mean", "total")
        for column in columns:
            table.add_column(column, justify="left" if column == "phase" else "right")
        for name, (calls, total) in sorted(self.results.items(), key=lambda item: -item[1][1]):
            row = {"phase": name, "calls": str(calls), "mean": _duration(total / max(calls, 1)),
                   "total": _duration(total), "percent": f"{total / overall:.1%}"}  # fmt: skip
            table.add_row(*(row[column] for column in columns))
        totals = {"phase": "total", "calls": "", "mean": "", "total": _duration(overall), "percent": "100.0%"}
        table.add_row(*(totals[column] for column in columns), style="bold")
        console = Console(width=120)
        with console.capture() as captured:
            console.print(table)
        return captured.get().rstrip()


class PyTorchProfiler(Profiler):
    """``torch.profiler`` over training batches: skip ``skip_first`` batches, then ``wait`` idle, ``warmup`` traced
    but discarded, ``active`` recorded, ``repeat`` times. Each recorded window is written as a Chrome trace,
    ``<dirpath>/rank<N>.<time>.pt.trace.json`` (default ``dirpath``: ``<trainer.log_dir>/profiler``), which
    TensorBoard (``tensorboard --logdir <dirpath>``, torch-tb-profiler plugin) and Perfetto open.

    CUDA kernels are recorded when training on a GPU. ``record_shapes``, ``profile_memory`` and ``with_stack`` are
    torch.profiler's options. The Trainer's phases (training_step, backward, optimizer step, hooks...) appear
    as named ranges. :attr:`trace_files` lists what this rank wrote.
    """

    def __init__(
        self,
        dirpath: Union[str, Path, None] = None,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
    ) -> None:
        for name, value, least in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1),
                                   ("repeat", repeat, 0), ("skip_first", skip_first, 0)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigurationError(f"PyTorchProfiler({name}={value!r}): must be an int >= {least}.")
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.schedule = dict(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.trace_files: list[Path] = []
        self._profile: Any = None
        self._ranges: list[Any] = []
        self._folder: Optional[Path] = None
        self._worker = "rank0"

    def setup(self, trainer: Any, stage: str) -> None:
        import torch.profiler as tp

        self._folder = self.dirpath if self.dirpath is not None else Path(trainer.log_dir) / "profiler"
        self._worker = f"rank{trainer.global_rank}"
        activities = [tp.ProfilerActivity.CPU]
        if trainer.strategy.root_device.type == "cuda":
            activities.append(tp.ProfilerActivity.CUDA)
        self._profile = tp.profile(
            activities=activities, schedule=tp.schedule(**self.schedule), on_trace_ready=self._write, **self.options
        )
        self._profile.start()

    def _write(self, profile: Any) -> None:
        self._folder.mkdir(parents=True, exist_ok=True)
        path = self._folder / f"{self._worker}.{time.time_ns()}.pt.trace.json"
        profile.export_chrome_trace(str(path))
        self.trace_files.append(path)

    def start(self, action: str) -> None:
        from torch.autograd.profiler import record_function

        scope = record_function(action)
        scope.__enter__()
        self._ranges.append(scope)

    def stop(self, action: str) -> None:
        self._ranges.pop().__exit__(None, None, None)

    def step(self) -> None:
        if self._profile is not None:
            self._profile.step()

    def teardown(self, trainer: Any, stage: str) -> None:
        while self._ranges:
            self._ranges.pop().__exit__(None, None, None)
        if self._profile is not None:
            self._profile.stop()  # writes a window still being recorded
            self._profile = None

    def summary(self) -> str:
        if not self.trace_files:
            return ""
        listed = "\n".join(f"  {path}" for path in self.trace_files)
        return f"PyTorch profiler traces (open in TensorBoard or https://ui.perfetto.dev):\n{listed}"


def build_profiler(value: Union[str, Profiler, None]) -> Optional[Profiler]:
    """``profiler=`` → ``None`` (off), a :class:`SimpleProfiler`, a :class:`PyTorchProfiler` or the given instance."""
    if value is None:
        return None
    if isinstance(value, Profiler):
        return value
    name = value.lower() if isinstance(value, str) else value  # Lightning accepts "Simple" too
    if name == "simple":
        return SimpleProfiler()
    if name == "pytorch":
        return PyTorchProfiler()
    raise ConfigurationError(
        f"profiler={value!r} is not understood. Use None (off), 'simple' (time per phase), 'pytorch' (torch.profiler "
        "traces) or a trainer.profiler.Profiler instance (e.g. PyTorchProfiler(active=5))."
    )


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} µs"
