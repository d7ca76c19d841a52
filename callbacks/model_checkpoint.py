"""``ModelCheckpoint``: save checkpoints during ``fit`` — the top-k by a monitored metric, the latest, ``last``.

When it saves (Lightning's rules): every ``every_n_train_steps`` optimizer steps, every
``train_time_interval``, or every ``every_n_epochs`` epochs (the default, 1; ``0`` never) — at the end of the
training epoch, or after validation when validation runs inside epochs or not every epoch. ``last`` is written
with each of those saves, and once at the end of training if nothing was saved before; no other save happens
outside the schedule. ``save_on_exception=True`` also saves when the fit raises. Nothing is saved under
``fast_dev_run``, during the sanity check, or twice for one global step.

Its bookkeeping (``best_k_models``, ``best_model_path``, ``last_model_path``, ...) is saved in every checkpoint
it writes, so top-k continues correctly after a resume.

Retention: beside the top-k, ``keep_last_n`` keeps the newest N checkpoints it saved. A file falls out only once
the checkpoint that replaces it is complete, and ``last`` is pointed at a checkpoint only once it is complete:
with ``asynchronous=True`` (the state is copied at the save and written in the background,
:mod:`trainer.strategies.checkpoint.async_checkpoint`) both wait for the background write.
"""
from __future__ import annotations

import math
import os
import re
import time
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional, Union

import torch

from trainer.callbacks.callback import Callback
from trainer.loggers.run_folder import planned_log_dir
from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.checkpoint_io import atomic_link
from trainer.strategies.checkpoint.hf_folder import save_hf_folder, the_hf_model
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_info, rank_zero_warn

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")
_TIME_CHECK_STEPS = 10  # with several processes, the clock is compared (one broadcast) every this many steps


class ModelCheckpoint(Callback):
    """Save checkpoints while training.

    ``ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=3, filename="{epoch}-{val_loss:.3f}",
    save_last=True)`` keeps the three best checkpoints by ``val_loss`` plus ``last.ckpt``.

    Args:
        dirpath: folder; default ``<trainer.log_dir>/checkpoints``.
        filename: template with ``{epoch}``, ``{step}`` and logged metrics, formats allowed (``{val_loss:.3f}``);
            with ``auto_insert_metric_name`` each field is written ``name=value``. Default ``"{epoch}-{step}"``.
        monitor: logged metric ranking the checkpoints; ``None`` keeps the latest ``save_top_k`` (-1, 0 or 1).
        mode: ``"min"`` or ``"max"``: which values of ``monitor`` are better.
        save_top_k: how many to keep; ``-1`` keeps all, ``0`` none (``last`` is still written with ``save_last``).
        save_last: also keep ``last.ckpt`` as the newest state: ``True`` (a hard link to the checkpoint just saved,
            or a full save), ``"link"`` (a symbolic link where possible).
        save_on_exception: also save a checkpoint (named by ``filename``, and ``last``) when the fit raises.
        save_weights_only: write module weights and hyperparameters only (not resumable).
        every_n_train_steps / train_time_interval / every_n_epochs: when to save (mutually exclusive);
            ``every_n_epochs=0`` never saves on epochs.
        save_on_train_epoch_end: save at the training epoch's end (``True``) or after validation (``False``);
            ``None`` decides from the validation schedule.
        enable_version_counter: add ``-v1``, ``-v2``... instead of overwriting a file of the same name.
        keep_last_n: also keep the newest N checkpoints this callback saved (besides the top-k); every due save
            then writes one. ``None`` (default): only the top-k rules.
        asynchronous: copy the state at the save and write it in a background thread; training goes on at once.
        save_hf: beside every checkpoint ``NAME.ckpt`` written, also write the module's ``transformers`` model as a
            Hugging Face folder ``NAME.hf`` (as :class:`HFCheckpoint`: each rank writes its shards), deleted with the
            checkpoint. A ``last`` that is a link to a checkpoint has that checkpoint's folder.
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(
        self,
        dirpath: Optional[Union[str, os.PathLike]] = None,
        filename: Optional[str] = None,
        monitor: Optional[str] = None,
        verbose: bool = False,
        save_last: Union[None, bool, str] = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: Optional[int] = None,
        train_time_interval: Optional[Union[timedelta, float]] = None,
        every_n_epochs: Optional[int] = None,
        save_on_train_epoch_end: Optional[bool] = None,
        enable_version_counter: bool = True,
        keep_last_n: Optional[int] = None,
        asynchronous: bool = False,
        save_hf: bool = False,
    ) -> None:
        _check_arguments(monitor, mode, save_top_k, save_last, every_n_train_steps, every_n_epochs, train_time_interval)
        if keep_last_n is not None and (isinstance(keep_last_n, bool) or not isinstance(keep_last_n, int)
                                        or keep_last_n < 1):  # fmt: skip
            raise ConfigurationError(f"ModelCheckpoint(keep_last_n={keep_last_n!r}) must be None or an int >= 1.")
        self.keep_last_n = keep_last_n
        if not isinstance(save_hf, bool):
            raise ConfigurationError(f"ModelCheckpoint(save_hf={save_hf!r}) must be True or False.")
        if save_hf and dirpath is not None and storage.is_remote(os.fspath(dirpath)):
            raise ConfigurationError(
                f"ModelCheckpoint(save_hf=True) writes Hugging Face folders on a local disk, but dirpath="
                f"{os.fspath(dirpath)!r} is remote. Give a local dirpath, or export later with "
                "`trainer checkpoint export --format hf CKPT DIRECTORY`."
            )
        self.save_hf = save_hf
        self.asynchronous = bool(asynchronous)
        self._recent: list[str] = []  # the checkpoints saved for keep_last_n, oldest first
        if dirpath is not None and not storage.is_remote(os.fspath(dirpath)) and os.path.isfile(dirpath):
            raise ConfigurationError(
                f"ModelCheckpoint(dirpath={os.fspath(dirpath)!r}) is an existing file, but dirpath is the folder the "
                "checkpoints are saved in. Pass a folder (it is created when needed), and name the files with "
                "filename=..."
            )
        self.dirpath: Optional[str] = _folder(dirpath) if dirpath else None
        self._dirpath_given = dirpath is not None
        self._dirpath_planned = False  # dirpath names a run folder not created yet; fixed before the first save
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = bool(save_on_exception)
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.enable_version_counter = enable_version_counter
        self._save_on_train_epoch_end = save_on_train_epoch_end
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs = 1
        self._every_n_train_steps = every_n_train_steps or 0
        self._every_n_epochs = every_n_epochs or 0
        seconds = train_time_interval.total_seconds() if isinstance(train_time_interval, timedelta) else train_time_interval
        self._train_time_interval: Optional[float] = None if seconds is None else float(seconds)

        self.best_k_models: dict[str, torch.Tensor] = {}
        self.kth_best_model_path = ""
        self.kth_value = torch.tensor(math.inf if mode == "min" else -math.inf, dtype=torch.float64)
        self.best_model_path = ""
        self.best_model_score: Optional[torch.Tensor] = None
        self.current_score: Optional[torch.Tensor] = None
        self.last_model_path = ""
        self._last_global_step_saved = 0
        self._just_saved = ""  # the file this callback wrote in the current save (last.ckpt links to it)
        self._last_checkpoint_saved = ""  # the newest file this callback wrote, in any save
        self._last_time_checked: Optional[float] = None
        self._time_checked_step = -1
        self._validated = False
        self._warned: set[str] = set()

    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            monitor=self.monitor, mode=self.mode, every_n_train_steps=self._every_n_train_steps,
            every_n_epochs=self._every_n_epochs, train_time_interval=self._train_time_interval,
        )  # fmt: skip

    @property
    def every_n_epochs(self) -> int:
        """Epochs between saves (``0``: no epoch-based saves)."""
        return self._every_n_epochs

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self._dirpath_given:
            # As Lightning: name the logger's next run folder without creating it; nothing is made until a save.
            planned = planned_log_dir(trainer.loggers[0]) if trainer.loggers else None
            self._dirpath_planned = planned is not None
            self.dirpath = _folder(storage.join(planned if planned is not None else trainer.log_dir, "checkpoints"))
        self.dirpath = trainer.strategy.broadcast(self.dirpath)  # the folder rank 0 writes to, on every rank
        if self.save_last == "link" and storage.is_remote(self.dirpath):  # Lightning's type and words
            raise ValueError(f"`ModelCheckpoint(save_last='link')` is only supported for local file paths, got "
                             f"`dirpath={self.dirpath}`: a URL's store has no links. Use save_last=True there.")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._dirpath_planned:  # the run folder is claimed by now (or here): its real version
            self._dirpath_planned = False
            self.dirpath = trainer.strategy.broadcast(_folder(storage.join(trainer.log_dir, "checkpoints")))
        if self.save_hf:  # refused before training, not at the first save
            the_hf_model(pl_module, "ModelCheckpoint(save_hf=True)")
            if self.dirpath is not None and storage.is_remote(self.dirpath):
                raise ConfigurationError(f"ModelCheckpoint(save_hf=True) writes Hugging Face folders on a local disk, "
                                         f"but its dirpath {self.dirpath!r} is remote. Give a local dirpath.")  # fmt: skip
        self._last_time_checked = time.monotonic()
        self._validated = False

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not (self._every_n_train_steps or self._train_time_interval) or self._skip(trainer):
            return
        every = self._every_n_train_steps
        if (every and trainer.global_step % every == 0) or (self._train_time_interval and self._time_is_up(trainer)):
            self._save_all(trainer, top_k=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._skip(trainer) and self._saves_on_train_epoch_end(trainer):
            self._save_all(trainer, top_k=self._epoch_is_due(trainer), last_if_saved=True)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or trainer.state_stage != "fit":
            return
        self._validated = True
        if not self._skip(trainer) and not self._saves_on_train_epoch_end(trainer):
            self._save_all(trainer, top_k=self._epoch_is_due(trainer), last_if_saved=True)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # As Lightning: saves on the schedule only (every_n_epochs=2 over 5 epochs writes epochs 1 and 3), and
        # ``last`` once if nothing was saved during the fit (save_top_k=0, say).
        if not self._skip(trainer):
            progress = getattr(getattr(trainer, "fit_loop", None), "progress", None)
            if progress is not None and progress.batch_in_epoch > 0 and not progress.epoch_finished:
                # max_steps stopped the epoch mid-way, so its end hooks did not run here; Lightning still ends that
                # epoch (and saves on its schedule): do the save the epoch end would have done.
                self._save_all(trainer, top_k=self._epoch_is_due(trainer), last_if_saved=True)
            if self.save_last and not self._last_checkpoint_saved and not self._skip(trainer):
                self._save_all(trainer, top_k=False)
        if self.monitor is not None and self.monitor in self._warned and not self.best_model_path and self.save_top_k:
            self._warn_never_logged(trainer)

    def _warn_never_logged(self, trainer: Any) -> None:
        """The fit ends and the monitored metric never came: say so once, loudly, not only in the per-epoch skip."""
        no_val = self.monitor.startswith("val") and sum(trainer.num_val_batches) == 0
        hint = (" No validation batch ran (an empty validation set, limit_val_batches=0, or no validation_step), so "
                "a metric logged in validation_step never existed." if no_val else "")
        kept = f" Only last.ckpt ({self.last_model_path}) was written." if self.last_model_path else ""
        rank_zero_warn(
            f"ModelCheckpoint(monitor={self.monitor!r}): the metric was never logged during this fit, so no "
            f"checkpoint was saved for it and best_model_path is empty.{hint}{kept} Log {self.monitor!r} with "
            "self.log(...), monitor a metric that is logged, or pass save_last=True to keep the final weights."
        )

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not self.save_on_exception or self._skip(trainer):
            return
        if trainer.world_size > 1:  # a save is a collective, and the other processes may not have raised
            self._warn_once("exception", "ModelCheckpoint(save_on_exception=True) saves in single-process runs only: "
                            "with several processes the others may not have raised, so the save would wait forever. "
                            "Save regularly with every_n_train_steps instead.")  # fmt: skip
            return
        metrics = self._monitor_candidates(trainer)
        path = self._unique_path(trainer, metrics, None, "")
        self._save(trainer, path)
        if self.save_last:
            previous = self.last_model_path
            self.last_model_path = self._unique_path(trainer, metrics, self.CHECKPOINT_NAME_LAST, previous)
            self._write_last(trainer, previous)
        rank_zero_info("%s was raised (%s): saved a checkpoint to %s", type(exception).__name__, exception, path)

    # ------------------------------------------------------------------ when
    def _skip(self, trainer: Any) -> bool:
        return (
            bool(trainer.fast_dev_run)
            or trainer.state_stage != "fit"
            or trainer.sanity_checking
            or self._last_global_step_saved == trainer.global_step
        )

    def _epoch_is_due(self, trainer: Any) -> bool:
        return self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0

    def _saves_on_train_epoch_end(self, trainer: Any) -> bool:
        if self._save_on_train_epoch_end is not None:
            return self._save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False
        if sum(trainer.num_val_batches) == 0:
            return True
        return trainer.val_check_interval is None or trainer.val_check_interval == 1.0

    def _time_is_up(self, trainer: Any) -> bool:
        step = trainer.global_step
        several = trainer.world_size > 1
        if step == self._time_checked_step or (several and step % _TIME_CHECK_STEPS):
            return False
        self._time_checked_step = step
        now = time.monotonic()
        due = self._last_time_checked is not None and now - self._last_time_checked >= self._train_time_interval
        if several:
            due = bool(trainer.strategy.broadcast(due))  # clocks differ between ranks; rank 0 decides
        if due:
            self._last_time_checked = now
        return due

    # ------------------------------------------------------------------ saving
    def _save_all(self, trainer: Any, top_k: bool, last_if_saved: bool = False) -> None:
        """Save the top-k (when ``top_k``) and ``last``; with ``last_if_saved`` (epoch ends), ``last`` only if a
        checkpoint was written now (or, with ``save_last="link"``, was written before), as Lightning does."""
        metrics = self._monitor_candidates(trainer)
        previous_last = self.last_model_path
        write_last = bool(self.save_last)
        if write_last:  # named first, so the checkpoints written now already record it
            self.last_model_path = self._unique_path(trainer, metrics, self.CHECKPOINT_NAME_LAST, previous_last)
        self._just_saved = ""
        if top_k and self.save_top_k != 0:
            if self.monitor is None:
                self._save_latest(trainer, metrics)
            else:
                self._save_if_top_k(trainer, metrics)
        if top_k and self.keep_last_n:
            self._keep_recent(trainer, metrics)
        if write_last and last_if_saved and not self._just_saved:
            write_last = self.save_last == "link" and bool(self._last_checkpoint_saved)
            if not write_last:
                self.last_model_path = previous_last
        if write_last:
            self._write_last(trainer, previous_last)

    def _save_latest(self, trainer: Any, metrics: dict[str, Any]) -> None:
        path = self._unique_path(trainer, metrics, None, self.best_model_path)
        previous, self.best_model_path = self.best_model_path, path
        self._save(trainer, path)
        if self.save_top_k == 1 and previous and not self.keep_last_n:
            self._remove_if_ours(trainer, previous, path)

    def _keep_recent(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Save a checkpoint now unless a top-k save just did, and drop the ones beyond the newest ``keep_last_n``."""
        if not self._just_saved:
            self._save(trainer, self._unique_path(trainer, metrics, None, ""))
        self._recent.append(self._just_saved)
        while len(self._recent) > self.keep_last_n:
            self._remove_if_ours(trainer, self._recent.pop(0), self._just_saved)

    def _save_if_top_k(self, trainer: Any, metrics: dict[str, Any]) -> None:
        value = metrics.get(self.monitor)
        if value is None:
            message = (
                f"ModelCheckpoint(monitor={self.monitor!r}) found no metric {self.monitor!r} among the logged ones "
                f"{sorted(metrics)}. Log it with self.log({self.monitor!r}, value) in the TrainModule."
            )
            if self._validated:
                raise ConfigurationError(message)
            self._warn_once(self.monitor, message + " (Skipping this save until it is logged.)")
            return
        current = float(trainer.strategy.broadcast(float(value)))  # every rank decides with rank 0's value
        if math.isnan(current):
            current = math.inf if self.mode == "min" else -math.inf
        if not self._is_top_k(current):
            if self.verbose:
                rank_zero_info("Epoch %d, step %d: %r was not in top %d", trainer.current_epoch,
                               trainer.global_step, self.monitor, self.save_top_k)  # fmt: skip
            return
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        evicted = ""
        if len(self.best_k_models) == k:
            evicted = self.kth_best_model_path
            self.best_k_models.pop(evicted)
        path = self._unique_path(trainer, metrics, None, evicted)
        # The logged tensor's dtype, as Lightning keeps the logged value (float32 for self.log of a float).
        floating = isinstance(value, torch.Tensor) and value.is_floating_point()
        self.current_score = torch.tensor(current, dtype=value.dtype if floating else torch.get_default_dtype())
        self.best_k_models[path] = self.current_score
        if len(self.best_k_models) == k:
            self.kth_best_model_path = _pick(self.best_k_models, worst=True, mode=self.mode)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = _pick(self.best_k_models, worst=False, mode=self.mode)
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose:
            rank_zero_info("Epoch %d, step %d: %r reached %.5g (best %.5g), saving '%s'", trainer.current_epoch,
                           trainer.global_step, self.monitor, current, float(self.best_model_score), path)  # fmt: skip
        self._save(trainer, path)
        if evicted:
            self._remove_if_ours(trainer, evicted, path)

    def _is_top_k(self, current: float) -> bool:
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        kth = float(self.best_k_models[self.kth_best_model_path])
        return current < kth if self.mode == "min" else current > kth

    def _write_last(self, trainer: Any, previous: str) -> None:
        path = self.last_model_path
        if self._just_saved:
            # A fault-tolerant job's groups share the folder; only the group that wrote the checkpoint links it.
            if trainer.is_global_zero and getattr(trainer.strategy, "is_checkpoint_writer", True):
                source, symbolic = self._just_saved, self.save_last == "link"
                _after_commit(trainer, lambda: atomic_link(source, path, symbolic=symbolic))
            trainer.strategy.barrier("ModelCheckpoint.last")
        else:
            self._save(trainer, path)
        if previous:
            self._remove_if_ours(trainer, previous, path)

    def _save(self, trainer: Any, path: str) -> None:
        self._last_global_step_saved = trainer.global_step  # before saving: the file records it
        if self.asynchronous:
            trainer.save_checkpoint(path, self.save_weights_only, asynchronous=True)
        else:
            trainer.save_checkpoint(path, self.save_weights_only)
        if self.save_hf:  # collective, as save_checkpoint: every rank writes the shards it holds
            save_hf_folder(trainer.lightning_module, hf_folder_of(path))
        self._just_saved = self._last_checkpoint_saved = path
        if trainer.is_global_zero:
            for logger in trainer.loggers:  # as Lightning: each logger may act on the new file (upload it)
                hook = getattr(logger, "after_save_checkpoint", None)
                if hook is not None:
                    hook(weakref.proxy(self))

    def _remove_if_ours(self, trainer: Any, previous: str, current: str) -> None:
        """Delete a file this callback wrote before, unless it is still in use or lies outside ``dirpath``."""
        if previous == current or previous in self.best_k_models or previous in (self.best_model_path,
                                                                                  self.last_model_path):
            return
        if previous in self._recent:
            return
        if trainer.ckpt_path is not None and _same_path(previous, trainer.ckpt_path):
            return  # the checkpoint this fit resumed from is the user's to delete
        if self.dirpath is not None and _inside(previous, self.dirpath) and trainer.is_global_zero:
            _after_commit(trainer, lambda: trainer.strategy.remove_checkpoint(previous))  # only once the new checkpoint is complete
            if self.save_hf:
                _after_commit(trainer, lambda: trainer.strategy.remove_checkpoint(hf_folder_of(previous)))

    # ------------------------------------------------------------------ names
    def _monitor_candidates(self, trainer: Any) -> dict[str, Any]:
        metrics = dict(trainer.callback_metrics)
        epoch = trainer.current_epoch
        progress = getattr(getattr(trainer, "fit_loop", None), "progress", None)
        if progress is not None and progress.batch_in_epoch == 0 and epoch > 0:
            epoch -= 1  # between epochs (at train end): name the file after the epoch that was trained last
        metrics["epoch"] = epoch
        metrics["step"] = trainer.global_step
        return metrics

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: Optional[str] = None,
                               ver: Optional[int] = None) -> str:  # fmt: skip
        """The path for a checkpoint with these metrics: ``filename`` (default: this callback's template)
        filled in, ``-v{ver}`` appended when given."""
        template = filename if filename is not None else (self.filename or "{epoch}-{step}")
        name = _FIELD.sub(lambda match: self._field(match, metrics), template)
        if ver is not None:
            name = f"{name}{self.CHECKPOINT_JOIN_CHAR}v{ver}"
        return os.path.join(self.dirpath or "", name + self.FILE_EXTENSION)

    def _field(self, match: "re.Match[str]", metrics: dict[str, Any]) -> str:
        name, spec = match.group(1), (match.group(2) or ":")[1:]
        value = metrics.get(name)
        if value is None:
            self._warn_once(f"template:{name}", f"ModelCheckpoint(filename={self.filename!r}): {name!r} is not logged "
                                                f"(logged: {sorted(metrics)}); it is written as 0.")  # fmt: skip
            value = 0
        if isinstance(value, torch.Tensor):
            value = value.item()
        try:
            text = format(value, spec)
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                f"ModelCheckpoint(filename={self.filename!r}): cannot format {name}={value!r} with ':{spec}' ({err})."
            ) from None
        return f"{name}{self.CHECKPOINT_EQUALS_CHAR}{text}" if self.auto_insert_metric_name else text

    def _unique_path(self, trainer: Any, metrics: dict[str, Any], filename: Optional[str], replaceable: str) -> str:
        path = self.format_checkpoint_name(metrics, filename)
        version = self.STARTING_VERSION
        while self.enable_version_counter and path != replaceable and self._exists(trainer, path):
            path = self.format_checkpoint_name(metrics, filename, ver=version)
            version += 1
        return path

    @staticmethod
    def _exists(trainer: Any, path: str) -> bool:
        return bool(trainer.strategy.broadcast(storage.exists(path)))

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)

    def to_yaml(self, filepath: Optional[Union[str, os.PathLike]] = None) -> None:
        """Write ``best_k_models`` (checkpoint path: score) as YAML, by default to ``<dirpath>/best_k_models.yaml``."""
        import yaml

        if filepath is None:
            if self.dirpath is None:
                raise ConfigurationError(
                    "ModelCheckpoint.to_yaml() needs a folder: give to_yaml(filepath) or call it after fit has set "
                    "dirpath."
                )
            filepath = storage.join(self.dirpath, "best_k_models.yaml")
        text = yaml.safe_dump({path: float(score) for path, score in self.best_k_models.items()})
        path = os.fspath(filepath)
        if storage.is_remote(path):
            fs, inner = storage.filesystem(path)
            with fs.open(inner, "w") as handle:
                handle.write(text)
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Bookkeeping saved in checkpoints (scores as tensors of the logged dtype, as Lightning saves them)."""
        return {
            "monitor": self.monitor,
            "dirpath": self.dirpath,
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,  # tensors, as Lightning saves them
            "current_score": self.current_score,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "last_model_path": self.last_model_path,
            "last_global_step_saved": self._last_global_step_saved,
            "recent_model_paths": list(self._recent),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the bookkeeping; if ``dirpath`` changed, only ``best_model_path`` is kept (the files elsewhere
        are not this run's to rotate)."""
        as_tensor = _score_tensor
        saved_dir = state_dict.get("dirpath", self.dirpath)
        if self.dirpath is None:  # not resolved here yet (e.g. a ddp_spawn caller taking rank 0's state back)
            self.dirpath = saved_dir
        if saved_dir == self.dirpath:
            self.best_model_score = as_tensor(state_dict.get("best_model_score"))
            self.current_score = as_tensor(state_dict.get("current_score"))
            self.best_k_models = {p: as_tensor(v) for p, v in state_dict.get("best_k_models", {}).items()}
            self.kth_best_model_path = state_dict.get("kth_best_model_path", "")
            self.kth_value = as_tensor(state_dict.get("kth_value", self.kth_value))
            self.last_model_path = state_dict.get("last_model_path", "")
            self._recent = list(state_dict.get("recent_model_paths", []))
        elif _sibling_runs(saved_dir, self.dirpath):  # the ordinary resume: the logger opened a new version_N
            rank_zero_info("ModelCheckpoint: resuming from %s; this run saves into %s (best_model_path is kept, top-k "
                           "starts afresh there).", saved_dir, self.dirpath)  # fmt: skip
        else:
            rank_zero_warn(
                f"ModelCheckpoint: the checkpoint folder changed from {saved_dir!r} to {self.dirpath!r}, so only "
                "best_model_path is restored; top-k bookkeeping starts afresh in the new folder (The dirpath has "
                "changed from the one the checkpoint recorded)."
            )
        self.best_model_path = state_dict.get("best_model_path", "")
        self._last_global_step_saved = state_dict.get("last_global_step_saved", self._last_global_step_saved)


def hf_folder_of(checkpoint: str) -> str:
    """The Hugging Face folder ``ModelCheckpoint(save_hf=True)`` writes beside ``checkpoint``: ``NAME.ckpt`` ->
    ``NAME.hf``."""
    stem = checkpoint[: -len(ModelCheckpoint.FILE_EXTENSION)] if checkpoint.endswith(ModelCheckpoint.FILE_EXTENSION) else checkpoint
    return stem + ".hf"


def _folder(path: Union[str, os.PathLike]) -> str:
    """An absolute, resolved local folder; a URL as given."""
    text = os.fspath(path)
    return text.rstrip("/") if storage.is_remote(text) else os.path.realpath(os.path.expanduser(text))


def _sibling_runs(a: Optional[str], b: Optional[str]) -> bool:
    """Whether ``a`` and ``b`` are the ``version_N/checkpoints`` folders of two runs of one experiment."""
    if not a or not b:
        return False
    a_path, b_path = Path(a.rstrip("/")), Path(b.rstrip("/"))
    return (a_path.name == b_path.name == "checkpoints" and a_path.parent.parent == b_path.parent.parent
            and all(re.fullmatch(r"version_\d+", p.parent.name) for p in (a_path, b_path)))  # fmt: skip


def _same_path(a: str, b: str) -> bool:
    if storage.is_remote(a) or storage.is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return Path(a).absolute() == Path(b).absolute()


def _inside(path: str, folder: str) -> bool:
    if storage.is_remote(path) or storage.is_remote(folder):
        return path.startswith(folder.rstrip("/") + "/")
    return Path(folder).absolute() in Path(path).absolute().parents


def _after_commit(trainer: Any, action: Any) -> None:
    """Run ``action`` once the checkpoint being written is complete (at once when it is written synchronously)."""
    connector = getattr(trainer, "_checkpoint", None)
    if connector is None:
        action()
    else:
        connector.after_commit(action)


def _score_tensor(value: Union[float, torch.Tensor, None]) -> Optional[torch.Tensor]:
    """A saved score as a tensor: tensors as saved, floats (checkpoints of earlier versions) as float64."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=torch.float64)


def _pick(scores: dict[str, torch.Tensor], worst: bool, mode: str) -> str:
    lowest = (mode == "min") != worst
    return (min if lowest else max)(scores, key=lambda path: float(scores[path]))


def _check_arguments(monitor: Optional[str], mode: str, save_top_k: Any, save_last: Any, every_n_train_steps: Any,
                     every_n_epochs: Any, train_time_interval: Any) -> None:  # fmt: skip
    if mode not in ("min", "max"):
        raise ConfigurationError(f"ModelCheckpoint(mode={mode!r}) is not valid: `mode` can be min, max but got {mode}.")
    if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
        raise ConfigurationError(f"ModelCheckpoint(save_top_k={save_top_k!r}) must be an int. Must be >= -1 (-1 keeps "
                                 "all).")  # fmt: skip
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise ConfigurationError(
            f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration: without a monitored "
            "metric there is no ranking. "
            "Set monitor='val_loss' (or another logged metric), or use save_top_k=-1 (all), 1 (latest) or 0."
        )
    if save_last not in (None, True, False, "link"):
        raise ConfigurationError(f"ModelCheckpoint(save_last={save_last!r}) must be None, True, False or 'link'.")
    for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigurationError(f"ModelCheckpoint({name}={value!r}) must be None or an int. Must be >= 0.")
    if train_time_interval is not None:
        seconds = train_time_interval.total_seconds() if isinstance(train_time_interval, timedelta) else train_time_interval
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ConfigurationError(
                f"ModelCheckpoint(train_time_interval={train_time_interval!r}) must be a positive timedelta or seconds."
            )
    triggers = [bool(every_n_train_steps), bool(every_n_epochs), train_time_interval is not None]
    if sum(triggers) > 1:
        raise ConfigurationError(
            "ModelCheckpoint: every_n_train_steps, every_n_epochs and train_time_interval are mutually exclusive; "
            f"set one of them (Combination of parameters every_n_train_steps={every_n_train_steps}, every_n_epochs="
            f"{every_n_epochs} and train_time_interval={train_time_interval} should be mutually exclusive)."
        )
