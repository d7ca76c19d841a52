"""Validation of the Trainer's plain arguments, and building its default loggers and callbacks.

Every check raises :class:`ConfigurationError` naming the argument, the value and what would be valid.
"""
from __future__ import annotations

import math
import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.callbacks.callback import Callback
from trainer.loggers.logger import Logger
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import PossibleUserWarning, rank_zero_info, rank_zero_warn
from trainer.strategies.checkpoint.storage import is_remote
from trainer.data.loaders import validate_limit


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigurationError(message)


def validate_arguments(args: dict[str, Any]) -> dict[str, Any]:
    """Check the loop-related Trainer arguments and return them normalised (fast_dev_run applied)."""
    out = dict(args)
    max_epochs, min_epochs, max_steps = args["max_epochs"], args["min_epochs"], args["max_steps"]
    _require(max_epochs is None or (_is_int(max_epochs) and max_epochs >= -1),
             f"max_epochs={max_epochs!r} must be None, -1 (no limit) or an int >= 0.")
    _require(min_epochs is None or (_is_int(min_epochs) and min_epochs >= 0),
             f"min_epochs={min_epochs!r} must be None or an int >= 0.")
    _require(_is_int(max_steps) and max_steps >= -1, f"max_steps={max_steps!r} must be -1 (no limit) or an int >= 0.")
    if min_epochs is not None and max_epochs not in (None, -1) and min_epochs > max_epochs:
        raise ConfigurationError(f"min_epochs={min_epochs} is larger than max_epochs={max_epochs}.")
    min_steps = args["min_steps"]
    _require(min_steps is None or (_is_int(min_steps) and min_steps >= 0),
             f"min_steps={min_steps!r} must be None or an int >= 0.")
    if min_steps is not None and max_steps != -1 and min_steps > max_steps:
        raise ConfigurationError(f"min_steps={min_steps} is larger than max_steps={max_steps}.")
    reload_every = args["reload_dataloaders_every_n_epochs"]
    _require(_is_int(reload_every) and reload_every >= 0,
             f"reload_dataloaders_every_n_epochs={reload_every!r}: it should be an int >= 0 (0: never).")

    check_accumulate_grad_batches(args["accumulate_grad_batches"])
    clip, algorithm = args["gradient_clip_val"], args["gradient_clip_algorithm"]
    _require(clip is None or (isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip >= 0),
             f"gradient_clip_val={clip!r} must be None or a number >= 0.")
    _require(algorithm is None or (isinstance(algorithm, str) and algorithm.lower() in ("norm", "value")),
             f"gradient_clip_algorithm={algorithm!r} is not valid. Use 'norm' or 'value' (None: 'norm').")
    # None (not set) stays None, as in Lightning: clip_gradients(algorithm=...) may then choose freely.
    out["gradient_clip_algorithm"] = algorithm.lower() if algorithm is not None else None
    out["gradient_clip_val"] = float(clip) if clip else None

    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        out[name] = validate_limit(name, args[name])
    interval = args["val_check_interval"]
    if isinstance(interval, float) and interval > 1.0 and math.isfinite(interval) and interval.is_integer():
        interval = out["val_check_interval"] = int(interval)  # a whole float counts batches, as in Lightning
    seconds = out["_val_check_seconds"] = val_check_seconds(interval)
    _require(interval is None or seconds is not None or (isinstance(interval, float) and 0.0 < interval <= 1.0)
             or (_is_int(interval) and interval >= 1),
             f"val_check_interval={interval!r} must be None, a float in (0.0, 1.0] (fraction of an epoch), an int >= 1 "
             "(number of training batches) or a time-based duration (str 'DD:HH:MM:SS', datetime.timedelta, or dict "
             f"kwargs for timedelta); you have passed invalid value {interval!r}.")
    every_n = args["check_val_every_n_epoch"]
    _require(every_n is None or (_is_int(every_n) and every_n >= 1),
             f"check_val_every_n_epoch={every_n!r} must be None or an int >= 1.")
    _require(every_n is not None or not isinstance(interval, float),
             f"val_check_interval={interval!r}: `val_check_interval` should be an integer or a time-based duration "
             "(str 'DD:HH:MM:SS', datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`."
             " A fraction of an epoch does not apply there: check_val_every_n_epoch=None counts batches across epochs.")
    if interval is None:
        out["val_check_interval"] = 1.0  # not given: once per epoch, which trainer.val_check_interval reads as Lightning's
    sanity = args["num_sanity_val_steps"]
    _require(_is_int(sanity) and sanity >= -1, f"num_sanity_val_steps={sanity!r} must be -1 (all), 0 (off) or an int > 0.")
    log_every = args["log_every_n_steps"]
    _require(_is_int(log_every) and log_every >= 1, f"log_every_n_steps={log_every!r} must be an int >= 1.")
    deterministic = args["deterministic"]
    _require(isinstance(deterministic, bool) or deterministic == "warn",
             f"deterministic={deterministic!r} must be True, False or 'warn'.")
    seed = args["seed"]
    _require(seed is None or (_is_int(seed) and 0 <= seed < 2**32), f"seed={seed!r} must be None or an int in [0, 2**32).")
    root = args["default_root_dir"]
    _require(root is None or isinstance(root, (str, os.PathLike)),
             f"default_root_dir={root!r} must be a path (str or os.PathLike) or None.")
    out["default_root_dir"] = (root.rstrip("/") if is_remote(root)  # "~" is the home folder, as in Lightning
                               else str(Path(root if root is not None else os.getcwd()).expanduser()))  # fmt: skip

    overfit = out["overfit_batches"] = validate_limit("overfit_batches", args["overfit_batches"])
    fast = args["fast_dev_run"]
    _require(isinstance(fast, bool) or (_is_int(fast) and fast >= 0),
             f"fast_dev_run={fast!r} is not a valid configuration: it should be >= 0 (a number of batches) or True/False.")
    if fast:
        batches = 1 if fast is True else int(fast)
        out.update(limit_train_batches=batches, limit_val_batches=batches, limit_test_batches=batches,
                   limit_predict_batches=batches, max_epochs=1, max_steps=batches, num_sanity_val_steps=0,
                   val_check_interval=1.0, _val_check_seconds=None, check_val_every_n_epoch=1,
                   log_every_n_steps=1)
    out["fast_dev_run"] = True if fast == 1 else fast  # Lightning's value: fast_dev_run=1 reads back as True
    if overfit:  # the same first batches every epoch, for training and validation (shuffling is turned off)
        out.update(limit_train_batches=overfit, limit_val_batches=overfit)
    if not fast:  # an int 1 and a float 1.0 mean different things: say which one was meant, as Lightning does
        for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                     "val_check_interval", "overfit_batches"):  # fmt: skip
            if _is_int(args[name]) and args[name] == 1:
                what = {"limit_train_batches": "1 batch per epoch will be used",
                        "val_check_interval": "validation will run after every batch"}.get(name, "1 batch will be used")
                rank_zero_info("`Trainer(%s=1)` was configured so %s.", name, what)
            elif isinstance(args[name], float) and args[name] == 1.0:
                what = {"limit_train_batches": "100% of the batches per epoch will be used",
                        "val_check_interval": "validation will run at the end of the training epoch"
                        }.get(name, "100% of the batches will be used")  # fmt: skip
                rank_zero_info("`Trainer(%s=1.0)` was configured so %s.", name, what)
    return out


def val_check_seconds(interval: Any) -> Optional[float]:
    """Seconds of a time-based ``val_check_interval`` (``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of its keyword
    arguments), as Lightning 2.6 accepts; ``None`` for a batch count or fraction (or ``None``)."""
    if not isinstance(interval, (str, dict, timedelta)):
        return None
    from trainer.callbacks.timer import parse_duration

    try:
        return parse_duration(interval)
    except ConfigurationError as err:
        raise ConfigurationError(
            f"val_check_interval={interval!r} is not a valid time-based duration: use a str 'DD:HH:MM:SS', a "
            f"datetime.timedelta or a dict of timedelta's keyword arguments (e.g. {{'minutes': 30}}). ({err})"
        ) from None


def resolve_max_epochs(max_epochs: Optional[int], max_steps: int, has_timer: bool) -> int:
    """``max_epochs=None`` at fit start, as Lightning resolves it: -1 (no epoch limit) when ``max_steps`` or a time
    limit ends the run, else 1000 with a warning (a run without any limit is rarely meant)."""
    if max_epochs is not None:
        return max_epochs
    if max_steps != -1 or has_timer:
        return -1
    rank_zero_warn("`max_epochs` was not set. Setting it to 1000 epochs. To train without an epoch limit, set "
                   "`max_epochs=-1`.", category=PossibleUserWarning)
    return 1000


def barebones_defaults(logger: Any, detect_anomaly: bool,
                       passed: Optional[dict[str, Any]] = None) -> tuple[bool, bool, bool, bool]:
    """``barebones=True``: no logger, checkpointing, progress bar or model summary (``logger``,
    ``enable_checkpointing``, ``enable_progress_bar``, ``enable_model_summary``); a logger passed explicitly or
    ``detect_anomaly=True`` contradicts it, as does any of ``passed`` (the arguments the caller gave explicitly)
    that turns back on what barebones turns off, as Lightning refuses."""
    if logger not in (True, False, None):
        raise ConfigurationError(
            f"barebones=True runs without loggers, but logger={logger!r} was passed. Drop one of the two."
        )
    for name in ("enable_checkpointing", "logger", "enable_progress_bar", "enable_model_summary", "log_every_n_steps",
                 "num_sanity_val_steps", "fast_dev_run"):  # fmt: skip
        value = (passed or {}).get(name)
        if value is not None and value is not False and value != 0:
            raise ConfigurationError(
                f"`Trainer(barebones=True, {name}={value!r})` was passed. barebones=True measures the bare loop, "
                f"so it turns {name} off: drop {name}={value!r} or barebones=True."
            )
    if detect_anomaly:
        raise ConfigurationError("barebones=True measures the bare loop; detect_anomaly=True contradicts it.")
    return False, False, False, False


def check_benchmark(benchmark: Optional[bool], deterministic: Any) -> None:
    """``benchmark`` is None, True or False, and not True together with ``deterministic`` (the flags themselves are
    set for each stage only: :mod:`trainer.reproducibility.torch_flags`)."""
    if benchmark is not None and not isinstance(benchmark, bool):
        raise ConfigurationError(f"benchmark={benchmark!r} must be None, True or False.")
    if benchmark and deterministic:
        raise ConfigurationError(
            f"benchmark=True lets cuDNN pick algorithms by timing, which contradicts deterministic={deterministic!r}. "
            "Drop one of the two."
        )


def with_max_time(callbacks: list[Callback], max_time: Any, save_checkpoint: bool) -> list[Callback]:
    """``max_time``: a ``Timer`` that stops fit after that much training time (unless one was passed)."""
    if max_time is None:
        return callbacks
    from trainer.callbacks.timer import Timer

    if any(isinstance(cb, Timer) for cb in callbacks):
        warnings.warn(f"max_time={max_time!r} is ignored: the callbacks already hold a Timer.", stacklevel=3)
        return callbacks
    return checkpoints_last(callbacks + [Timer(duration=max_time, interval="step", save_checkpoint=save_checkpoint)])


def check_ckpt_path(value: Any, stage: str) -> Any:
    """``ckpt_path`` of ``fit``/``validate``/``test``/``predict``: None, a path (str or os.PathLike) or one of the
    names ("last", "best", "auto"); anything else (``ckpt_path=True``) is refused before the stage starts."""
    if value is None or (isinstance(value, (str, os.PathLike)) and os.fspath(value)):
        return value
    raise ConfigurationError(
        f"{stage}(ckpt_path={value!r}) is not a checkpoint. Pass the path of a checkpoint file (or folder), "
        "'last' (the newest of this run's folder), 'best', 'auto' (resume when there is something to resume), "
        "or None to start fresh."
    )


def check_accumulate_grad_batches(value: Any) -> int:
    """``accumulate_grad_batches`` (Trainer and Engine): an int >= 1."""
    _require(_is_int(value) and value >= 1,
             f"accumulate_grad_batches={value!r} must be an int >= 1 (1 means no accumulation).")
    return value


def build_loggers(logger: Any, root_dir: str, fast_dev_run: int) -> list[Logger]:
    """``logger=True`` → the default (TensorBoard, else CSV) under ``root_dir``; False/None → none. Under
    ``fast_dev_run`` a :class:`~trainer.loggers.logger.DummyLogger` takes the loggers' place (as in Lightning):
    nothing is written, and ``self.logger.experiment.<anything>(...)`` in a step still works."""
    if logger is False or logger is None or (isinstance(logger, (list, tuple)) and not logger):
        return []
    if fast_dev_run:
        from trainer.loggers.logger import DummyLogger

        return [DummyLogger()]
    if logger is True and is_remote(root_dir):
        rank_zero_info("default_root_dir=%r is a URL: checkpoints go there, but the default logger writes local files, "
                       "so there is none. Pass logger=TensorBoardLogger('runs') (or CSVLogger) to log locally.", root_dir)
        return []
    if logger is True:
        from trainer.loggers import default_logger

        created = default_logger(root_dir)
        return [created] if created is not None else []
    loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for item in loggers:
        if not isinstance(item, Logger):
            raise ConfigurationError(
                f"logger={item!r} is not a Logger. Pass True (default TensorBoard logger), False, a "
                "trainer.loggers.Logger instance or a list of them."
            )
    from trainer.loggers.run_folder import share_versions

    share_versions(loggers)
    return loggers


def build_callbacks(
    callbacks: Any, enable_checkpointing: bool, enable_progress_bar: bool, enable_model_summary: bool
) -> list[Callback]:
    """The user's callbacks plus the defaults the ``enable_*`` flags ask for (unless the user gave one)."""
    if callbacks is None:
        user: list[Any] = []
    elif isinstance(callbacks, Callback):
        user = [callbacks]
    elif isinstance(callbacks, (list, tuple)):
        user = list(callbacks)
    else:
        raise ConfigurationError(f"callbacks={callbacks!r} must be a Callback or a list of Callbacks.")
    for cb in user:
        if not isinstance(cb, Callback):
            raise ConfigurationError(
                f"callbacks: {cb!r} is a {type(cb).__name__}, not a trainer.Callback. Subclass trainer.Callback "
                "and override the hooks you need."
            )
    from trainer.callbacks.fit_report import FitReport
    from trainer.callbacks.model_checkpoint import ModelCheckpoint
    from trainer.callbacks.model_summary import ModelSummary
    from trainer.callbacks.progress_bar import ProgressBar
    from trainer.callbacks.rich_progress import RichProgressBar

    defaults: list[Callback] = []
    for enabled, cls, kind in ((enable_model_summary, ModelSummary, ModelSummary),
                               (enable_progress_bar, RichProgressBar, ProgressBar),  # a user's own bar replaces ours
                               (enable_progress_bar, FitReport, FitReport)):  # fmt: skip
        if enabled and not any(isinstance(cb, kind) for cb in user):
            defaults.append(cls())
    has_checkpoint = any(isinstance(cb, ModelCheckpoint) for cb in user)
    if enable_checkpointing and not has_checkpoint:
        defaults.append(ModelCheckpoint())
    if not enable_checkpointing and has_checkpoint:
        raise ConfigurationError(
            "Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks list: "
            "the flag turns checkpointing off, the callback asks for it. Drop enable_checkpointing=False to keep "
            "the ModelCheckpoint, or drop the callback."
        )
    return checkpoints_last(defaults + user)


def checkpoints_last(callbacks: list[Callback]) -> list[Callback]:
    """Move checkpointing callbacks to the end, so a checkpoint saved in a hook holds what the other callbacks
    (early stopping, schedulers of callbacks) did in that same hook."""
    from trainer.callbacks.model_checkpoint import ModelCheckpoint

    return [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)] + [
        cb for cb in callbacks if isinstance(cb, ModelCheckpoint)
    ]


def check_init_setting(check_init: Optional[bool]) -> bool:
    """``Trainer(check_init=...)``: a bool; ``None`` reads ``TRAINER_CHECK_INIT`` (``1``/``true``/``yes`` turn it
    on), so a test suite or a job script can check every Trainer it starts."""
    if check_init is None:
        value = os.environ.get("TRAINER_CHECK_INIT", "").strip().lower()
        if value in ("", "0", "false", "no", "off"):
            return False
        if value in ("1", "true", "yes", "on"):
            return True
        raise ConfigurationError(f"TRAINER_CHECK_INIT={value!r} must be 1, true, yes, on or 0, false, no, off.")
    if not isinstance(check_init, bool):
        raise ConfigurationError(f"check_init={check_init!r} must be True or False (None: TRAINER_CHECK_INIT decides).")
    return check_init
