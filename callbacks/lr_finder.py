"""``LearningRateFinder``: the learning-rate range test, run before training, with a plot and a suggestion."""
from __future__ import annotations

import csv
import math
import os
import logging
import warnings
from typing import Any, Optional

from trainer.callbacks.callback import Callback
from trainer.callbacks.host import training_batches
from trainer.callbacks.lr_scaling import record_hparam, scale_learning_rates
from trainer.callbacks.trial_steps import TrialSteps, TunerExit
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_warn

log = logging.getLogger(__name__)


def suggest_lr(lrs: list[float], losses: list[float], skip_begin: int = 10, skip_end: int = 1) -> Optional[float]:
    """Lightning's suggestion: the learning rate where the (smoothed) loss falls fastest with respect to the
    learning rate (the most negative gradient), over the finite points left once the first ``skip_begin`` and
    last ``skip_end`` are dropped; ``None`` (with an error logged, as Lightning) when fewer than two remain."""
    end = len(losses) - skip_end
    points = [(lr, loss) for lr, loss in zip(lrs[skip_begin:end], losses[skip_begin:end]) if math.isfinite(loss)]
    if len(points) < 2 or len({lr for lr, _ in points}) < len(points):
        log.error("Failed to compute suggestion for learning rate because there are not enough points. Increase the "
                  "loop iteration limits or the size of your dataset/dataloader.")  # fmt: skip
        return None
    x, y = [lr for lr, _ in points], [loss for _, loss in points]
    return x[min(range(len(x)), key=lambda i: _gradient(x, y, i))]


def _gradient(x: list[float], y: list[float], i: int) -> float:
    """dy/dx at point ``i`` of unevenly spaced samples: second-order central differences inside, one-sided at the
    ends (``torch.gradient``/``numpy.gradient`` with coordinates, which Lightning uses)."""
    if i == 0:
        return (y[1] - y[0]) / (x[1] - x[0])
    if i == len(x) - 1:
        return (y[i] - y[i - 1]) / (x[i] - x[i - 1])
    left, right = x[i] - x[i - 1], x[i + 1] - x[i]
    return (left**2 * y[i + 1] + (right**2 - left**2) * y[i] - right**2 * y[i - 1]) / (left * right * (left + right))


class LRFinderResult:
    """The curve of a learning-rate range test, as Lightning's ``lr_find`` returns it: :attr:`results`
    (``{"lr": [...], "loss": [...]}``), :meth:`suggestion` and :meth:`plot`."""

    def __init__(self, results: dict[str, list[float]], mode: str) -> None:
        self.results = results
        self.mode = mode

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> Optional[float]:
        """The learning rate where the smoothed loss falls fastest, ignoring the first ``skip_begin`` and last
        ``skip_end`` points; ``None`` when the curve is too short or never falls."""
        return suggest_lr(self.results["lr"], self.results["loss"], skip_begin, skip_end)

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """A matplotlib ``Figure`` of loss against learning rate (on ``ax`` when given), with the suggestion
        marked when ``suggest``; ``show=True`` also shows it (through pyplot)."""
        try:
            from matplotlib.figure import Figure  # no pyplot unless show=True: no global backend is touched
        except ImportError:
            raise ConfigurationError("LRFinderResult.plot() needs matplotlib: pip install matplotlib.") from None
        if ax is None:
            figure = Figure(figsize=(6, 4), tight_layout=True)
            ax = figure.add_subplot()
        else:
            figure = ax.figure
        lrs, losses = self.results["lr"], self.results["loss"]
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        suggestion = self.suggestion() if suggest else None
        if suggestion:
            ax.plot([suggestion], [losses[lrs.index(suggestion)]], "o", color="red", label=f"suggestion {suggestion:.3g}")
            ax.legend()
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if show:
            import matplotlib.pyplot as plt

            plt.show()
        return figure


class LearningRateFinder(Callback):
    """Before training, raise the learning rate from ``min_lr`` to ``max_lr`` over ``num_training_steps``
    steps (exponentially, or ``mode="linear"``), record the loss, and suggest the rate where it falls fastest.

    The run stops early once the smoothed loss exceeds ``early_stop_threshold`` times its best (it diverged).
    The curve is saved as ``lr_find.csv`` and, with matplotlib installed, ``lr_find.png`` in
    ``trainer.log_dir``. With ``update_attr=True`` the optimizer's learning rates are scaled so the first
    parameter group uses the suggestion (and a module attribute or hyperparameter ``lr``/``learning_rate``
    records it; ``attr_name`` names another). Every other effect of the test (weights, optimizer state, RNG) is
    undone. Single device only; runs only on a fresh fit. Results: :attr:`results` (``{"lr": [...], "loss":
    [...]}``), :attr:`suggestion` (the rate), :attr:`optimal_lr` (Lightning's result object, with
    ``suggestion()`` and ``plot()``).
    """

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: Optional[float] = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
        smoothing: float = 0.05,
        weights_only: Optional[bool] = None,
    ) -> None:
        if not (min_lr > 0 and max_lr > 0):
            raise ConfigurationError(f"LearningRateFinder: min_lr and max_lr must be > 0; got min_lr={min_lr}, "
                                     f"max_lr={max_lr}.")  # fmt: skip
        if min_lr > max_lr:  # Lightning runs the range downwards; usually the arguments are swapped
            warnings.warn(f"LearningRateFinder: min_lr={min_lr} > max_lr={max_lr}, so the learning rate falls during "
                          "the range test, from min_lr to max_lr. Swap them to run it upwards.", UserWarning,
                          stacklevel=2)  # fmt: skip
        if mode not in ("exponential", "linear"):
            raise ConfigurationError(f"LearningRateFinder(mode={mode!r}) must be 'exponential' or 'linear'.")
        if num_training_steps < 1:
            raise ConfigurationError("LearningRateFinder: num_training_steps must be >= 1 (a suggestion needs 3).")
        self.min_lr, self.max_lr = min_lr, max_lr
        self.num_training_steps = num_training_steps
        self.mode = mode
        self.early_stop_threshold = early_stop_threshold
        self.update_attr = update_attr
        self.attr_name = attr_name
        self.smoothing = smoothing
        self.weights_only = weights_only  # Lightning's (it reloads a checkpoint); the state is restored in memory here
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self.suggestion: Optional[float] = None
        self.optimal_lr: Optional[LRFinderResult] = None
        self.plot_path: Optional[str] = None
        self._early_exit = False  # set by trainer.tuner.Tuner: end the fit after the test

    def lr_at(self, step: int) -> float:
        """The learning rate of range-test step ``step``."""
        fraction = step / (self.num_training_steps - 1) if self.num_training_steps > 1 else 0.0
        if self.mode == "linear":
            return self.min_lr + fraction * (self.max_lr - self.min_lr)
        return self.min_lr * (self.max_lr / self.min_lr) ** fraction

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if trainer.global_step > 0:
            return  # resumed: keep the run's learning rate
        if trainer.fast_dev_run:  # as in Lightning: no search, no result, the quick check goes on
            rank_zero_warn("Skipping learning rate finder since `fast_dev_run` is enabled: fast_dev_run runs only a "
                           "few batches to check the code, too few for the range test; the learning rate is unchanged.")
            self.optimal_lr = None
            if self._early_exit:
                raise TunerExit()
            return
        self.run(trainer, module)
        if trainer.is_global_zero:
            self.save(trainer.log_dir)
            unchanged = "no suggestion (the loss never fell); the learning rate is unchanged"
            print(f"LearningRateFinder: suggested learning rate {self.suggestion:.3g}" if self.suggestion
                  else f"LearningRateFinder: {unchanged}")  # fmt: skip
        if self.update_attr and self.suggestion:
            first = trainer.optimizers[0].param_groups[0]["lr"]
            scale_learning_rates(trainer, self.suggestion / first)
            record_hparam(module, (self.attr_name,) if self.attr_name else ("lr", "learning_rate"), self.suggestion)
        if self._early_exit:
            raise TunerExit()

    def run(self, trainer: Any, module: Any) -> None:
        """The range test itself: fills :attr:`results` and :attr:`suggestion`, then undoes its training."""
        trials = TrialSteps(trainer, module, "The learning rate finder")
        groups = trials.optimizer.param_groups
        ratios = [group["lr"] / groups[0]["lr"] if groups[0]["lr"] else 1.0 for group in groups]
        lrs: list[float] = []
        losses: list[float] = []
        average, best = 0.0, math.inf
        try:
            batches = _cycle(trainer.fit_loop.combined_loader)
            for step in range(self.num_training_steps):
                lr = self.lr_at(step)
                for group, ratio in zip(groups, ratios):
                    group["lr"] = lr * ratio
                step_loss = trials.step(next(batches))
                lrs.append(lr)
                if step_loss is None:  # training_step returned None: no loss for this rate, as in Lightning
                    losses.append(math.nan)
                    continue
                loss = float(step_loss)  # the test needs every loss: one sync per step
                average = (1 - self.smoothing) * average + self.smoothing * loss
                smoothed = average / (1 - (1 - self.smoothing) ** (step + 1))
                losses.append(smoothed)
                if not math.isfinite(smoothed):
                    break
                best = min(best, smoothed)
                if self.early_stop_threshold is not None and step > 0 and smoothed > self.early_stop_threshold * best:
                    break
        finally:
            trials.restore()
        self.results = {"lr": lrs, "loss": losses}
        self.suggestion = suggest_lr(lrs, losses)
        self.optimal_lr = LRFinderResult(self.results, self.mode)

    def save(self, folder: str) -> None:
        """Write ``lr_find.csv`` and, when matplotlib is installed, ``lr_find.png`` into ``folder``."""
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "lr_find.csv"), "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["lr", "loss"])
            writer.writerows(zip(self.results["lr"], self.results["loss"]))
        try:
            from matplotlib.figure import Figure  # no pyplot: no global backend or window is touched
        except ImportError:
            warnings.warn("LearningRateFinder: install matplotlib for lr_find.png; lr_find.csv has the curve.",
                          stacklevel=2)  # fmt: skip
            return
        figure = Figure(figsize=(6, 4), tight_layout=True)
        axes = figure.add_subplot()
        axes.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            axes.set_xscale("log")
        if self.suggestion:
            index = self.results["lr"].index(self.suggestion)
            label = f"suggestion {self.suggestion:.3g}"
            axes.plot([self.suggestion], [self.results["loss"][index]], "o", color="red", label=label)
            axes.legend()
        axes.set_xlabel("learning rate")
        axes.set_ylabel("loss (smoothed)")
        self.plot_path = os.path.join(folder, "lr_find.png")
        figure.savefig(self.plot_path)


def _cycle(loader: Any) -> Any:
    """Batches of ``loader`` again and again (the test may need more steps than one epoch has)."""
    while True:
        empty = True
        for batch in training_batches(loader):
            empty = False
            yield batch
        if empty:
            raise ConfigurationError("LearningRateFinder: the training dataloader is empty.")
