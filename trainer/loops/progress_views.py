"""Lightning's loop progress objects as read-only views: ``trainer.fit_loop.epoch_loop.batch_progress``,
``trainer.validate_loop.batch_progress`` and the like, which Lightning users' callbacks and tests read.

Nothing here runs per step: the training counters are :class:`~trainer.loops.progress.Progress`'s own, read when a
view is read; an evaluation run adds one to two ints of :class:`EvalCounts` per batch.
"""
from __future__ import annotations

from typing import Any


class EvalCounts:
    """Batches of one evaluation loop: ``total`` (Lightning: since the training epoch started for fit's validation,
    since the Trainer was built for ``validate``/``test``/``predict``) and ``current`` (this run);
    ``is_last_batch`` is True once a run went through its loaders (set at their end, not per batch)."""

    __slots__ = ("total", "current", "is_last_batch")

    def __init__(self) -> None:
        self.total = 0
        self.current = 0
        self.is_last_batch = False

    def start_run(self) -> None:
        """A new run: ``current`` starts again."""
        self.current = 0
        self.is_last_batch = False

    def reset(self) -> None:
        """Both counts back to 0 (a new training epoch for fit's validation, after the sanity check)."""
        self.total = self.current = 0
        self.is_last_batch = False


class Tracker:
    """One of Lightning's progress trackers (``total`` or ``current``), read-only: ``completed`` batches (the
    ``count`` attribute of ``source``), and ``ready``/``started``/``processed``, which count the batch running now
    too (``running.batch_running``, where given). Plain references, no closures: the Trainer stays picklable."""

    def __init__(self, source: Any, count: str, running: Any = None) -> None:
        self._source = source
        self._count = count
        self._running = running

    @property
    def completed(self) -> int:
        """Batches finished (their ``on_*_batch_end`` hooks ran)."""
        return getattr(self._source, self._count)

    @property
    def ready(self) -> int:
        """Batches fetched: the finished ones and the one running now."""
        running = self._running is not None and self._running.batch_running
        return getattr(self._source, self._count) + int(running)

    started = processed = ready

    def __repr__(self) -> str:
        return f"Tracker(ready={self.ready}, completed={self.completed})"


class BatchProgress:
    """Lightning's ``batch_progress``: ``total`` and ``current`` trackers and ``is_last_batch`` (read from
    ``last``'s attribute of that name), read-only."""

    def __init__(self, total: Tracker, current: Tracker, last: Any) -> None:
        self.total = total
        self.current = current
        self._last = last

    @property
    def is_last_batch(self) -> bool:
        """Whether the batch running (or last run) is its loader's last."""
        return self._last.is_last_batch

    def __repr__(self) -> str:
        return f"BatchProgress(total={self.total!r}, current={self.current!r})"


class EvaluationLoopView:
    """``trainer.validate_loop``/``test_loop``/``predict_loop`` and ``trainer.fit_loop.epoch_loop.val_loop`` as
    Lightning users read them: ``batch_progress`` over the loop's :class:`EvalCounts`."""

    def __init__(self, counts: EvalCounts) -> None:
        self.counts = counts
        self.batch_progress = BatchProgress(Tracker(counts, "total"), Tracker(counts, "current"), counts)
