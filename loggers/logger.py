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

    @property
    def root_dir(self) -> Optional[str]:
        """Folder holding every version of this experiment, if any."""
        return None

    @property
    def group_separator(self) -> str:
        """What joins a metric's group and name (``"train/loss"``)."""
        return "/"

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called by ``ModelCheckpoint`` after each checkpoint it writes (e.g. to upload it); it receives the
        callback (its ``best_model_path``, ``last_model_path``, ``best_k_models``)."""

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


class DummyExperiment:
    """An experiment that accepts every call and does nothing: ``experiment.add_scalar(...)``, ``experiment[0]``."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        """Accept any arguments; do nothing."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.nop

    def __getitem__(self, index: Any) -> "DummyExperiment":
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class DummyLogger(Logger):
    """The logger under ``fast_dev_run`` (as in Lightning): records nothing, and its ``experiment`` accepts any
    call, so a step's ``self.logger.experiment.add_scalar(...)`` runs without writing files."""

    def __init__(self) -> None:
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        """An object on which every method call is a no-op."""
        return self._experiment

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def __getitem__(self, index: int) -> "DummyLogger":
        return self

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        """Records nothing, whatever it is given."""

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        """Records nothing, whatever it is given."""

    def __getattr__(self, name: str) -> Any:
        """Any other method a logger-specific call expects (``log_image``, ``log_text``, ...): a no-op."""
        if name.startswith("_"):  # private and special names stay missing (copy, pickle, hasattr checks)
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> None:
            return None

        return method
