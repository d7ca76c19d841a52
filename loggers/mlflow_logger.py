"""``MLflowLogger``: metrics and params to an MLflow tracking store (a local ``file:`` folder by default).

``mlflow`` is imported only when the run is first used; install it with ``pip install trainer[mlflow]``.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Optional

from trainer.loggers.logger import Logger
from trainer.loggers.run_folder import flatten_params
from trainer.strategies.rank import rank_zero_only

_STATUS = {"success": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_BAD_KEY_CHARS = re.compile(r"[^\w\-./ ]")  # MLflow accepts alphanumerics, _ - . / and space


class MLflowLogger(Logger):
    """Log to MLflow: one run in ``experiment_name`` per fit. ``tracking_uri`` defaults to ``file:./mlruns``."""

    def __init__(
        self,
        experiment_name: str = "default",
        run_name: Optional[str] = None,
        tracking_uri: Optional[str] = None,
        tags: Optional[dict[str, Any]] = None,
        run_id: Optional[str] = None,
    ) -> None:
        self._experiment_name = experiment_name
        self._run_name = run_name
        default_uri = f"file:{os.path.abspath('mlruns')}"
        self._tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri
        self._tags = {k: str(v) for k, v in (tags or {}).items()}
        self._run_id = run_id
        self._client: Any = None

    @property
    def experiment(self) -> Any:
        """The ``MlflowClient`` (created, with the experiment and run, on first use)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self._tracking_uri)
            if self._run_id is None:
                found = client.get_experiment_by_name(self._experiment_name)
                experiment_id = found.experiment_id if found else client.create_experiment(self._experiment_name)
                run = client.create_run(experiment_id, run_name=self._run_name, tags=self._tags)
                self._run_id = run.info.run_id
            self._client = client
        return self._client

    @property
    def name(self) -> str:
        """Experiment name."""
        return self._experiment_name

    @property
    def version(self) -> str:
        """The MLflow run id."""
        self.experiment  # noqa: B018 - creating the run assigns its id
        return str(self._run_id)

    @property
    def run_id(self) -> str:
        """The MLflow run id."""
        return self.version

    @property
    def save_dir(self) -> Optional[str]:
        """The local folder of a ``file:`` store, else ``None``."""
        uri = self._tracking_uri
        return uri[len("file:"):] if uri.startswith("file:") else None

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        """One MLflow metric per value, at ``step``."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_BAD_KEY_CHARS.sub("_", k), float(v), now, step or 0) for k, v in metrics.items()]
        self.experiment.log_batch(self._run_id, metrics=batch)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any], metrics: Optional[dict[str, float]] = None) -> None:
        """Params as strings (nested dicts flattened to ``a/b``)."""
        from mlflow.entities import Param

        flat = flatten_params(params)
        batch = [Param(_BAD_KEY_CHARS.sub("_", k), str(v)[:500]) for k, v in flat.items()]
        self.experiment.log_batch(self._run_id, params=batch)
        if metrics:
            self.log_metrics(metrics, 0)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Mark the run FINISHED, FAILED or KILLED."""
        if self._client is not None:
            self._client.set_terminated(self._run_id, _STATUS.get(status, "FINISHED"))


#: Lightning spells it ``MLFlowLogger``.
MLFlowLogger = MLflowLogger
