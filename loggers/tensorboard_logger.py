"""``TensorBoardLogger``: scalars, hyperparameters (with final metrics) and optionally the model graph,
written with TensorBoard's ``SummaryWriter`` into ``save_dir/name/version_N``."""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Optional, Union

from trainer.loggers.log_files import log_write_error, quiet_writer_threads
from trainer.loggers.run_folder import FolderLogger, flatten_params, plain_value, save_hparams_yaml
from trainer.strategies.rank import rank_zero_only

# An interrupted run (Ctrl-C, a stop signal) may be resumed: the dashboard shows it as still running.
_STATUS = {"success": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "interrupted": "STATUS_RUNNING"}


class TensorBoardLogger(FolderLogger):
    """Log to TensorBoard: ``tensorboard --logdir <save_dir>`` shows every version side by side.

    Hyperparameters go to ``hparams.yaml`` and to the HParams dashboard; the dashboard's metric columns
    are the scalars this run logged, written when the run ends so they hold the final values.
    ``log_graph=True`` records the module's graph at the start of fit, traced with
    ``module.example_input_array``. ``tensorboard`` is imported when the first event is written.
    As in Lightning, ``default_hp_metric=True`` logs ``hp_metric = -1`` when hyperparameters are logged without
    metrics (the HParams dashboard shows runs that have a metric), and ``sub_dir`` puts the event files in
    ``save_dir/name/version_N/sub_dir``.
    """

    def __init__(
        self,
        save_dir: Union[str, os.PathLike],
        name: Optional[str] = "logs",
        version: Union[int, str, None] = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: Union[str, os.PathLike, None] = None,
        **writer_kwargs: Any,
    ) -> None:
        super().__init__(save_dir, name, version)
        self._log_graph = bool(log_graph)
        self._default_hp_metric = bool(default_hp_metric)
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._prefix = prefix
        self._writer_kwargs = writer_kwargs
        self._writer: Any = None
        self._hparams: dict[str, Any] = {}
        self._metric_names: dict[str, None] = {}  # insertion-ordered set of scalar tags logged

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` (created on first use on global rank 0; ``None`` on other ranks)."""
        if self._writer is None and rank_zero_only.rank == 0:  # type: ignore[attr-defined]
            from torch.utils.tensorboard import SummaryWriter

            quiet_writer_threads()
            try:
                self._writer = SummaryWriter(log_dir=self._created_log_dir(), **self._writer_kwargs)
            except OSError as err:
                raise self._write_error(err) from None
        return self._writer

    @property
    def sub_dir(self) -> Optional[str]:
        """The folder under the version folder holding the event files, if one was given."""
        return self._sub_dir

    @property
    def log_dir(self) -> str:
        """``save_dir/name/version_N`` (``/sub_dir`` with a ``sub_dir``; ``~`` and ``$VARS`` expanded), from the
        ``name`` and ``version`` properties (a subclass may override them, as in Lightning)."""
        version = self.version
        path = os.path.join(self.root_dir, version if isinstance(version, str) else f"version_{version}")
        if self._sub_dir is not None:
            path = os.path.join(path, self._sub_dir)
        return os.path.expanduser(os.path.expandvars(path))

    def _created_log_dir(self) -> str:
        self._folder.create()  # claims the version folder
        path = self.log_dir
        os.makedirs(path, exist_ok=True)
        return path

    def _write_error(self, err: OSError) -> OSError:
        return log_write_error(err, self._folder.path, "TensorBoard event files in")

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        """One scalar per metric at ``step``."""
        writer = self.experiment
        names = self._metric_names
        try:
            for key, value in metrics.items():
                tag = self._prefix + key
                writer.add_scalar(tag, plain_value(value), step)
                names[tag] = None
        except OSError as err:  # the writer thread's failed write (a full disk), raised on the next event
            raise self._write_error(err) from None

    @rank_zero_only
    def log_hyperparams(self, params: Optional[dict[str, Any]] = None, metrics: Any = None,
                        step: Optional[int] = None) -> None:  # fmt: skip
        """Record hyperparameters in ``hparams.yaml`` now, and in the HParams dashboard when the run ends
        (or now, with ``metrics``, which are also logged as scalars at ``step``; a single number is
        ``hp_metric``). Without ``metrics``, ``hp_metric = -1`` is logged when ``default_hp_metric=True``."""
        self._hparams.update(params or {})
        save_hparams_yaml(os.path.join(self._created_log_dir(), "hparams.yaml"), self._hparams)
        if metrics is None:
            if self._default_hp_metric:  # a placeholder the user overwrites with self.log("hp_metric", ...)
                self.log_metrics({"hp_metric": -1}, step)
            return
        if not isinstance(metrics, dict):
            metrics = {"hp_metric": metrics}
        if metrics:
            self.log_metrics(metrics, step)
            self._write_hparams("success")

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Trace ``model`` with ``input_array`` (default ``model.example_input_array``); only with
        ``log_graph=True``."""
        if not self._log_graph:
            return
        example = input_array if input_array is not None else getattr(model, "example_input_array", None)
        if example is None:
            warnings.warn(
                "TensorBoardLogger(log_graph=True) needs an example input: set module.example_input_array "
                "(a tensor or tuple of tensors shaped like one batch). The graph is not logged.",
                stacklevel=2,
            )
            return
        device = next((p.device for p in model.parameters()), None)
        if device is not None:
            example = _to_device(example, device)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # add_graph traces with the deprecated torch.jit
                self.experiment.add_graph(model, example)
        except Exception as err:  # tracing fails on data-dependent control flow; the run must go on
            warnings.warn(f"TensorBoardLogger could not trace the model graph: {err}", stacklevel=2)

    @rank_zero_only
    def save(self) -> None:
        """Flush pending events to disk; write ``hparams.yaml`` into the run's folder if it is not there yet (as
        Lightning's, so every run has one)."""
        log_dir = self.log_dir
        if os.path.isdir(log_dir) and not os.path.isfile(os.path.join(log_dir, "hparams.yaml")):
            save_hparams_yaml(os.path.join(log_dir, "hparams.yaml"), self._hparams)
        if self._writer is not None:
            try:
                self._writer.flush()
            except OSError as err:
                raise self._write_error(err) from None

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write the hyperparameters with the metric names logged and the run's status; close the file."""
        try:
            if self._hparams:
                self._write_hparams(status)
            if self._writer is not None:
                self._writer.flush()
        except OSError as err:
            raise self._write_error(err) from None
        finally:
            if self._writer is not None:
                try:
                    self._writer.close()  # a later log call reopens a new event file in the same folder
                except OSError:
                    pass  # the flush above already raised this write's error

    def _write_hparams(self, status: str) -> None:
        from torch.utils.tensorboard.summary import hparams

        params = {k: plain_value(v) for k, v in flatten_params(self._hparams).items()}
        metrics = {name: 0.0 for name in self._metric_names if name != self._prefix + "epoch"}
        experiment, start, _ = hparams(params, metrics)  # its end summary always says "success"
        writer = self.experiment._get_file_writer()
        for summary in (experiment, start, _session_end(status)):
            writer.add_summary(summary)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_writer"] = None  # a SummaryWriter holds a thread: spawned ranks rebuild it on demand
        return state


def _session_end(status: str) -> Any:
    """The HParams plugin's session-end summary with the run's real status (tensorboard's own helper needs
    TensorFlow)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo

    info = SessionEndInfo(status=api_pb2.Status.Value(_STATUS.get(status, "STATUS_UNKNOWN")), end_time_secs=time.time())
    content = HParamsPluginData(session_end_info=info, version=metadata.PLUGIN_DATA_VERSION)
    plugin = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString())
    tagged = Summary.Value(tag=metadata.SESSION_END_INFO_TAG, metadata=SummaryMetadata(plugin_data=plugin))
    return Summary(value=[tagged])


def _to_device(example: Any, device: Any) -> Any:
    if isinstance(example, (list, tuple)):
        return type(example)(_to_device(x, device) for x in example)
    return example.to(device) if hasattr(example, "to") else example
