"""``RichProgressBar``: epoch, step and validation bars with it/s, ETA and the ``prog_bar=True`` metrics."""
from __future__ import annotations

import math
import time
from typing import Any, Optional

from trainer.callbacks.progress_bar import ProgressBar
from trainer.callbacks.bar_views import BarViews


def _total(value: float) -> Optional[float]:
    return None if value is None or math.isinf(value) else value


def format_metrics(metrics: dict[str, float]) -> str:
    """``loss=0.1234 val_acc=0.91`` (4 significant digits)."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


class RichProgressBar(BarViews, ProgressBar):
    """Progress of fit/validate/test/predict, drawn with rich. Added by default (``enable_progress_bar=True``).

    On a terminal: live bars (epochs, the current epoch's batches, validation) redrawn at most every
    ``refresh_interval`` seconds. Elsewhere (CI logs, files, pipes): a plain line every ``line_interval``
    seconds and one at the end of every epoch and validation, so logs stay readable.

    Per batch it only stores the batch index and compares the clock; metrics are read from
    ``trainer.progress_bar_metrics`` (which reads the device) only when it redraws.
    Pass ``console=rich.console.Console(...)`` to draw somewhere else. Only global rank 0 draws.
    Lightning's ``refresh_rate`` (batches) and ``leave`` are accepted: ``refresh_rate=0`` hides the bars, other
    values keep the time-based redraw. What the bars show is :meth:`get_metrics` (``v_num`` and the
    ``prog_bar=True`` metrics): override it to change that.
    """

    def __init__(
        self,
        refresh_interval: float = 0.1,
        line_interval: float = 10.0,
        console: Any = None,
        console_kwargs: Optional[dict[str, Any]] = None,
        *,
        refresh_rate: Optional[int] = None,
        leave: bool = False,
    ) -> None:
        super().__init__()
        self.refresh_rate = refresh_rate
        self.leave = leave
        self.refresh_interval = refresh_interval
        self.line_interval = line_interval
        self.console = console
        self.console_kwargs = console_kwargs or {}
        self._display: Any = None
        self._interval = refresh_interval
        self._enabled = True
        self._next = 0.0  # monotonic time of the next redraw
        self._done = 0  # batches finished in the running bar
        self._bar = "train"
        self._resume: tuple[str, int] = ("train", 0)  # the bar a validation interrupted
        self._before_val: dict[str, float] = {}
        self._val_keys: set[str] = set()  # prog_bar keys validations have logged
        self._epoch_start = 0.0
        self._module: Any = None
        self._opened: dict[str, tuple[str, Optional[float]]] = {}  # key -> (description, total), for BarViews
        self._finished: dict[str, int] = {}  # batches of a bar that is no longer the running one

    # ------------------------------------------------------------------ display
    @property
    def display(self) -> Any:
        """The live bars or the plain-line printer, created on first use."""
        if self._display is None:
            from rich.console import Console

            from trainer.callbacks.progress_display import make_display

            console = self.console if self.console is not None else Console(**self.console_kwargs)
            self.console = console
            self._display = make_display(console)
            self._interval = self.refresh_interval if self._display.live else self.line_interval
        return self._display

    def _open(self, key: str, description: str, total: Optional[float]) -> None:
        if self._enabled:
            self._record_open(key, description, total)
            self._bar, self._done = key, 0
            self.display.open(key, description, total)
            self._next = time.monotonic() + self._interval

    def _count(self, key: str) -> int:
        if key == self._bar:
            return self._done
        if key == self._resume[0]:
            return self._resume[1]
        return self._finished.get(key, 0)

    def _show(self, trainer: Any, description: Optional[str] = None, metrics: Optional[str] = None) -> None:
        self._next = time.monotonic() + self._interval
        if metrics is None:
            quiet = trainer.sanity_checking or trainer.predicting  # nothing is logged there
            metrics = "" if quiet else format_metrics(self.get_metrics(trainer, self._module))
        self.display.show(self._bar, self._done, metrics, description)

    def _tick(self, trainer: Any) -> None:
        """One more batch in an evaluation bar; redraw when due."""
        self._done += 1
        if self._enabled and time.monotonic() >= self._next:
            self._show(trainer)

    def _stop(self) -> None:
        if self._display is not None:
            self._display.stop()

    # ------------------------------------------------------------------ fit
    @property
    def is_enabled(self) -> bool:
        """Whether the bar draws."""
        return self._enabled

    @property
    def is_disabled(self) -> bool:
        """Whether the bar is hidden."""
        return not self._enabled

    def disable(self) -> None:
        """Stop drawing."""
        self._enabled = False

    def enable(self) -> None:
        """Draw again (on global rank 0, unless ``refresh_rate=0``)."""
        self._enabled = self.refresh_rate != 0

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Print a line above the bars."""
        if self._enabled:
            self.display.message(sep.join(map(str, args)))

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        self._trainer, self._module = trainer, module
        self._enabled = trainer.is_global_zero and self.refresh_rate != 0

    def on_sanity_check_start(self, trainer: Any, module: Any) -> None:
        steps = trainer.num_sanity_val_steps
        limits = [n if steps == -1 else min(steps, n) for n in trainer.num_val_batches]
        self._open("sanity", "Sanity check", _total(sum(limits)))

    def on_sanity_check_end(self, trainer: Any, module: Any) -> None:
        if self._enabled:
            self.display.close("sanity")
            self._bar = "train"

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if self._enabled and trainer.max_epochs > 0 and self.display.live:
            self.display.open("epochs", "Epochs", trainer.max_epochs)
            self.display.show("epochs", trainer.current_epoch)

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        self._epoch_start = time.monotonic()
        self._open("train", self._epoch_name(trainer), _total(trainer.num_training_batches))

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._done = batch_idx + 1
        if self._enabled and time.monotonic() >= self._next:
            self._show(trainer, f"{self._epoch_name(trainer)} step {trainer.global_step}")

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if not self._enabled:
            return
        display = self.display
        self._bar = "train"
        metrics = format_metrics(self.get_metrics(trainer, module))
        if display.live:
            self._show(trainer, self._epoch_name(trainer), metrics)
            display.show("epochs", trainer.current_epoch + 1)
        seconds = time.monotonic() - self._epoch_start
        name, step = self._epoch_name(trainer), trainer.global_step
        line = f"{name} done  {self._done} batches in {seconds:.1f}s  step {step}  {metrics}"
        display.message(line.rstrip())

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._stop()

    @staticmethod
    def _epoch_name(trainer: Any) -> str:
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs > 0 else ""
        return f"Epoch {trainer.current_epoch + 1}{epochs}"

    # ------------------------------------------------------------------ validation (in fit and alone)
    def on_validation_start(self, trainer: Any, module: Any) -> None:
        if not trainer.sanity_checking:
            self._resume = self._bar, self._done
            self._before_val = dict(self.get_metrics(trainer, module)) if self._enabled else {}
            in_fit = trainer.state_stage == "fit"  # validate() alone: the count is not exposed, the bar has no total
            self._open("val", "Validation", _total(sum(trainer.num_val_batches)) if in_fit else None)

    def on_validation_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:  # fmt: skip
        self._tick(trainer)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if not self._enabled or trainer.sanity_checking:
            return
        # Show what this validation produced, not the training metrics: the keys it changed or added, and every key
        # an earlier validation showed (its value may simply not have changed since then).
        before = self._before_val
        current = self.get_metrics(trainer, module)
        self._val_keys.update(k for k, v in current.items() if k not in before or before[k] != v)
        metrics = {k: v for k, v in current.items() if k in self._val_keys}
        self.display.close("val", f"Validation  {self._done} batches  {format_metrics(metrics)}".rstrip())
        self._finished["val"] = self._done
        self._bar, self._done = self._resume
        if trainer.state_stage != "fit":
            self._stop()

    # ------------------------------------------------------------------ test and predict
    def on_test_start(self, trainer: Any, module: Any) -> None:
        self._open("test", "Test", None)

    def on_test_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:  # fmt: skip
        self._tick(trainer)

    def on_test_end(self, trainer: Any, module: Any) -> None:
        if self._enabled:
            self.display.close("test", f"Test  {self._done} batches")
            self._stop()

    def on_predict_start(self, trainer: Any, module: Any) -> None:
        self._open("predict", "Predict", None)

    def on_predict_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:  # fmt: skip
        self._tick(trainer)

    def on_predict_end(self, trainer: Any, module: Any) -> None:
        if self._enabled:
            self.display.close("predict", f"Predict  {self._done} batches")
            self._stop()

    # ------------------------------------------------------------------ always release the terminal
    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        self._stop()
