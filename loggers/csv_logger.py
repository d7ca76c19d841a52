"""``CSVLogger``: ``metrics.csv`` (one row per logging call, one column per metric) and ``hparams.yaml``
in ``save_dir/name/version_N``. Needs nothing beyond the standard library (and PyYAML for hparams)."""
from __future__ import annotations

import csv
import io
import os
from typing import Any, Optional, Union

from trainer.loggers.log_files import log_write_error, write_text_atomically
from trainer.loggers.run_folder import FolderLogger, plain_value, save_hparams_yaml
from trainer.strategies.checkpoint import storage
from trainer.strategies.rank import rank_zero_only, rank_zero_warn


class ExperimentWriter:
    """``CSVLogger.experiment`` (Lightning's name): the CSV logger's rows as Lightning's writer shows them.
    ``metrics`` are the rows buffered since the last ``save()``; writing goes through the logger."""

    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, logger: "CSVLogger") -> None:
        self._logger = logger

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows logged and not yet written."""
        return self._logger._rows

    @property
    def hparams(self) -> dict[str, Any]:
        return self._logger._hparams

    @property
    def log_dir(self) -> str:
        return self._logger.log_dir

    @property
    def metrics_file_path(self) -> str:
        return self._logger.metrics_file_path

    def log_metrics(self, metrics_dict: dict[str, float], step: Optional[int] = None) -> None:
        """Add a row (``step`` defaults to the number of rows buffered, as in Lightning)."""
        self._logger.log_metrics(metrics_dict, len(self.metrics) if step is None else step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        self._logger.log_hyperparams(params)

    def save(self) -> None:
        self._logger.save()


class CSVLogger(FolderLogger):
    """Log metrics to ``metrics.csv``; readable with ``pandas.read_csv`` or any spreadsheet.

    Rows are buffered and written every ``flush_logs_every_n_steps`` logging calls and when the run
    ends. A metric first logged mid-run (e.g. validation metrics after the first epoch) adds a column:
    the file is then rewritten once with the wider header, earlier rows leaving the new column empty.
    """

    def __init__(
        self,
        save_dir: Union[str, os.PathLike],
        name: Optional[str] = "logs",
        version: Union[int, str, None] = None,
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        super().__init__(save_dir, name, version)
        self._flush_every = max(int(flush_logs_every_n_steps), 1)
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = []  # header of the file on disk
        self._hparams: dict[str, Any] = {}
        self._experiment: Optional[ExperimentWriter] = None

    @property
    def metrics_file_path(self) -> str:
        """Path of ``metrics.csv``."""
        return storage.join(self.log_dir, ExperimentWriter.NAME_METRICS_FILE)

    @property
    def experiment(self) -> ExperimentWriter:
        """The writer (Lightning's ``ExperimentWriter``): ``metrics`` buffered, ``metrics_file_path``, ``save()``.
        Made on first use (the first logged value), with a warning, as Lightning's, when the run's folder already
        holds files: a ``version`` given twice writes over the earlier run's logs."""
        if self._experiment is None:
            self._experiment = ExperimentWriter(self)
            log_dir = self.log_dir
            rank = rank_zero_only.rank  # type: ignore[attr-defined]
            if rank == 0 and storage.isdir(log_dir) and storage.listdir(log_dir):
                rank_zero_warn(f"Experiment logs directory {log_dir} exists and is not empty. Previous log files in "
                               "this directory will be deleted when the new ones are saved!")  # fmt: skip
                if storage.isfile(self.metrics_file_path):  # this run's rows start a new file, as Lightning's
                    _remove(self.metrics_file_path)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        """Buffer one row: ``step`` and the metrics."""
        if self._experiment is None:
            self.experiment  # noqa: B018 - made on first use, as Lightning's
        row: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            row[key] = plain_value(value)
        self._rows.append(row)
        if len(self._rows) >= self._flush_every:
            self.save()

    @rank_zero_only
    def log_hyperparams(self, params: Optional[dict[str, Any]] = None, metrics: Optional[dict[str, float]] = None) -> None:
        """Write ``hparams.yaml`` (and ``metrics`` as a row at step 0)."""
        if self._experiment is None:
            self.experiment  # noqa: B018 - made on first use, as Lightning's
        self._hparams.update(params or {})
        save_hparams_yaml(storage.join(self._folder.create(), "hparams.yaml"), self._hparams)
        if metrics:
            self.log_metrics(metrics, 0)

    @rank_zero_only
    def save(self) -> None:
        """Write buffered rows: append when the columns are known, else rewrite the file with the new header."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        columns = list(self._columns)
        known = set(columns)
        for row in rows:
            for key in row:
                if key not in known:
                    known.add(key)
                    columns.append(key)
        path = storage.join(self._folder.create(), "metrics.csv")
        remote = storage.is_remote(path)  # object stores cannot append: the file is rewritten whole there
        if columns == self._columns and not remote and os.path.exists(path):
            try:
                with open(path, "a", newline="", encoding="utf-8") as fh:
                    csv.DictWriter(fh, fieldnames=columns).writerows(rows)
            except OSError as err:
                raise log_write_error(err, path) from None
            return
        previous: list[dict[str, Any]] = []
        if self._columns and remote and storage.exists(path):
            previous = list(csv.DictReader(io.StringIO(storage.read_bytes(path).decode("utf-8"), newline="")))
        elif self._columns and os.path.exists(path):
            with open(path, newline="", encoding="utf-8") as fh:
                previous = list(csv.DictReader(fh))

        def write(fh: Any) -> None:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows(previous)
            writer.writerows(rows)

        write_text_atomically(path, write, newline="")
        self._columns = columns

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write what is buffered."""
        self.save()


def _remove(path: str) -> None:
    """Delete the file at ``path`` (an fsspec URL or a local path)."""
    if storage.is_remote(path):
        storage.remove(path)
    else:
        os.remove(path)
