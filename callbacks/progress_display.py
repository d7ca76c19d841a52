"""The two ways ``RichProgressBar`` shows progress: live rich bars on a terminal, plain lines elsewhere.

Both take the same calls (``open``/``show``/``close``/``message``/``stop``); the callback decides when.
Imported only when a progress bar first displays something (it imports rich).
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Optional

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _SpeedColumn(ProgressColumn):
    """Iterations per second, as rich estimates them from the updates it was given."""

    def render(self, task: Any) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:.2f} it/s", style="progress.data.speed")


class LiveBars:
    """Rich bars redrawn only when :meth:`show` is called (no refresh thread)."""

    live = True

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            _SpeedColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=console,
            auto_refresh=False,
        )
        self.tasks: dict[str, Any] = {}
        self.started = False

    def open(self, key: str, description: str, total: Optional[float]) -> None:
        """Start (or restart) the bar ``key``."""
        if not self.started:
            self.progress.start()
            self.started = True
        if key in self.tasks:
            self.progress.remove_task(self.tasks.pop(key))
        self.tasks[key] = self.progress.add_task(description, total=total, metrics="")

    def show(self, key: str, completed: float, metrics: str = "", description: Optional[str] = None) -> None:
        """Move bar ``key`` to ``completed`` and redraw."""
        task = self.tasks.get(key)
        if task is None:
            return
        self.progress.update(task, completed=completed, metrics=metrics, description=description)
        self.progress.refresh()

    def close(self, key: str, line: Optional[str] = None) -> None:
        """Remove bar ``key``; print ``line`` (a summary) above the bars."""
        task = self.tasks.pop(key, None)
        if task is not None:
            self.progress.remove_task(task)
        if line:
            self.message(line)
        elif self.started:
            self.progress.refresh()

    def message(self, line: str) -> None:
        """Print a line above the bars."""
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def stop(self) -> None:
        """Leave the final state on screen and release the terminal."""
        if self.started:
            self.progress.refresh()
            self.progress.stop()
            self.started = False
        self.tasks.clear()


class PlainLines:
    """One self-contained text line per :meth:`show` call: for CI logs and files, where bars would be noise."""

    live = False

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bars: dict[str, tuple[str, Optional[float], float]] = {}  # key → (description, total, start)

    def open(self, key: str, description: str, total: Optional[float]) -> None:
        """Remember the bar's description, total and start time."""
        self.bars[key] = (description, total, time.monotonic())

    def show(self, key: str, completed: float, metrics: str = "", description: Optional[str] = None) -> None:
        """Print ``description  completed/total  elapsed<eta  it/s  metrics``."""
        bar = self.bars.get(key)
        if bar is None:
            return
        name, total, start = bar
        elapsed = time.monotonic() - start
        speed = completed / elapsed if elapsed > 0 else 0.0
        parts = [description or name, f"{int(completed)}/{'?' if total is None else int(total)}"]
        timing = _clock(elapsed)
        if total is not None and speed > 0 and completed < total:
            timing += f"<{_clock((total - completed) / speed)}"
        parts += [timing, f"{speed:.2f} it/s"]
        if metrics:
            parts.append(metrics)
        self.message("  ".join(parts))

    def close(self, key: str, line: Optional[str] = None) -> None:
        """Forget bar ``key``; print ``line`` if given."""
        self.bars.pop(key, None)
        if line:
            self.message(line)

    def message(self, line: str) -> None:
        """Print one line."""
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def stop(self) -> None:
        """Nothing is live."""
        self.bars.clear()


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


def make_display(console: Console) -> Any:
    """Live bars on a terminal or in Jupyter, plain lines otherwise (pipes, files, CI)."""
    return LiveBars(console) if console.is_terminal or console.is_jupyter else PlainLines(console)
