"""``WandbLogger``: metrics and config to Weights & Biases (``offline=True`` writes locally, no account needed).

``wandb`` is imported only when the run is first used.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Union

from trainer.loggers.logger import Logger
from trainer.loggers.run_folder import flatten_params
from trainer.strategies.rank import rank_zero_only


class WandbLogger(Logger):
    """Log to W&B. ``offline=True`` keeps the run under ``save_dir/wandb`` (sync later with ``wandb sync``)."""

    def __init__(
        self,
        project: Optional[str] = None,
        name: Optional[str] = None,
        save_dir: Union[str, os.PathLike] = ".",
        offline: bool = False,
        **init_kwargs: Any,
    ) -> None:
        self._project = project
        self._name = name
        self._save_dir = os.fspath(save_dir)
        self._offline = offline
        self._init_kwargs = init_kwargs
        self._run: Any = None

    @property
    def experiment(self) -> Any:
        """The ``wandb`` run (started on first use)."""
        if self._run is None:
            import wandb

            os.makedirs(self._save_dir, exist_ok=True)
            self._run = wandb.init(project=self._project, name=self._name, dir=self._save_dir,
                                   mode="offline" if self._offline else None, **self._init_kwargs)  # fmt: skip
        return self._run

    @property
    def name(self) -> str:
        """Project name."""
        return self._project or "default"

    @property
    def version(self) -> str:
        """The W&B run id."""
        return str(self.experiment.id)

    @property
    def save_dir(self) -> str:
        """Folder under which ``wandb/`` holds the run files."""
        return self._save_dir

    @property
    def log_dir(self) -> Optional[str]:
        """The run's local files folder."""
        return getattr(self.experiment, "dir", None)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        """Metrics at ``step`` (W&B needs steps that never decrease)."""
        self.experiment.log(dict(metrics), step=step)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any], metrics: Optional[dict[str, float]] = None) -> None:
        """Hyperparameters into the run's config."""
        self.experiment.config.update(flatten_params(params), allow_val_change=True)
        if metrics:
            self.log_metrics(metrics, 0)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Finish the run (exit code 1 unless it succeeded)."""
        if self._run is not None:
            self._run.finish(exit_code=0 if status == "success" else 1)
            self._run = None
