"""The ``Logger`` base: where the Trainer sends metrics and hyperparameters. Only global rank 0 writes."""
from __future__ import annotations

from typing import Any, Optional


class Logger:
    """Base class for experiment loggers. The Trainer calls these methods on global rank 0 only."""

    @property
    def name(self) -> str:
        """Experiment name."""
        return "default"

    @property
    def version(self) -> Any:
        """Experiment version (e.g. ``0`` for ``version_0``)."""
        return 0

    @property
    def save_dir(self) -> Optional[str]:
        """Root folder this logger writes under, if any."""
        return None

    @property
    def log_dir(self) -> Optional[str]:
        """Folder of this run's files, if any (checkpoints go under it by default)."""
        return None

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        """Record scalar metrics at ``step``."""

    def log_hyperparams(self, params: dict[str, Any], metrics: Optional[dict[str, float]] = None) -> None:
        """Record the run's hyperparameters (optionally with final metrics)."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Record the model graph, where the backend supports it."""

    def save(self) -> None:
        """Flush pending writes."""

    def finalize(self, status: str) -> None:
        """Called once at the end of a run with ``"success"``, ``"failed"`` or ``"interrupted"``."""
        self.save()
