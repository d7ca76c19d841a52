"""What a checkpoint holds, and how a fit is saved and restored from one.

A checkpoint is a plain dict of tensors and Python values (loadable with ``torch.load(weights_only=True)``):
``format_version``, ``state_dict``, ``optimizer_states``, ``lr_schedulers``, ``precision``, ``epoch``,
``global_step``, ``loops`` (progress counters and ``should_stop``), ``rng`` (every global RNG at the save),
``train_sampler`` (the random state the epoch's shuffle was drawn from, see :mod:`trainer.checkpoint.data_position`),
``accumulated_grads`` (only when saved inside an accumulation window), ``callbacks``, ``hyper_parameters``,
``datamodule``. Files are written atomically and read safely through :mod:`trainer.strategies.checkpoint.checkpoint_io`.
The strategy chooses the format: sharded strategies write folders (:mod:`trainer.strategies.checkpoint.sharded_checkpoint`) whose
``state_dict``/``optimizer_states`` hold each rank's shards; every strategy reads both kinds.

Saving asynchronously (``save(path, asynchronous=True)``) hands the write to a :class:`BackgroundWriter`
(:mod:`trainer.strategies.checkpoint.async_checkpoint`); which checkpoint ``"last"``/``"auto"`` resume from is
:mod:`trainer.checkpoint.auto_resume`'s policy, found by :mod:`trainer.checkpoint.lookup`.

Exact resume: the restored fit puts the saved RNG back just before its first epoch starts; mid-epoch, the
training iterator is positioned first (the sampler redraws the epoch's order from ``train_sampler`` and
skips the finished batches without loading them) and the saved RNG is put back after that.
"""
from __future__ import annotations

import ast

import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import torch


from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, safe_load, verify_once
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_info, rank_zero_warn
from trainer.checkpoint import auto_resume
from trainer.checkpoint import lookup as checkpoint_lookup
from trainer.checkpoint.data_position import TrainDataPosition
from trainer.module.saving import check_state_dict
from trainer.reproducibility.seed import capture_rng_state, restore_rng_state

FORMAT_VERSION = 1
_VERSION_FOLDER = re.compile(r"version_\d+")


class NoCheckpointYet(FileNotFoundError):
    """``ckpt_path="last"`` found no checkpoint in the run's folders."""


class CheckpointConnector:
    """Builds checkpoint dicts from a Trainer's state and restores a Trainer from them."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.data_position = TrainDataPosition()
        self.last_saved_path: Optional[str] = None  # the newest full checkpoint this Trainer wrote or resumed from
        self._resume: Optional[dict[str, Any]] = None
        self._pending: Optional[tuple[Any, dict[str, Any]]] = None  # restored in part: the rest after on_fit_start
        self._writer: Any = None  # the BackgroundWriter of asynchronous saves, created by the first one
        #: Told of every full checkpoint once it is complete, on every rank (a cluster integration: Ray's report).
        self.saved_listeners: list[Callable[[str], None]] = []
        #: Where a fit without ``ckpt_path`` resumes from, when a cluster integration knows (Ray's get_checkpoint).
        self.resume_source: Optional[Callable[[], Optional[str]]] = None

    # ------------------------------------------------------------------ saving
    def dump(self, weights_only: bool = False) -> dict[str, Any]:
        """The checkpoint dict for the current state (hooks may add entries)."""
        trainer = self.trainer
        strategy = trainer.strategy
        progress = trainer.fit_loop.progress
        module = trainer.module
        checkpoint: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "epoch": progress.epoch,
            "global_step": progress.global_step,
            "state_dict": strategy.module_state_dict(),
            "loops": {"fit": progress.state_dict(), "should_stop": bool(trainer.should_stop)},
        }
        if module.hparams:
            checkpoint["hyper_parameters"] = dict(module.hparams)
        if not weights_only:
            checkpoint["optimizer_states"] = [strategy.optimizer_state_dict(opt) for opt in trainer.optimizers]
            checkpoint["lr_schedulers"] = [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs]
            checkpoint["precision"] = strategy.precision.state_dict()
            checkpoint["rng"] = capture_rng_state()
            checkpoint["train_sampler"] = self.data_position.state_dict(self._from_every_rank,
                                                                      progress.batch_in_epoch)
            if getattr(getattr(trainer, "_optimization", None), "window_has_loss", False):
                checkpoint["accumulated_grads"] = self._accumulated_grads()
            checkpoint["callbacks"] = {cb.state_key: cb.state_dict() for cb in trainer.callbacks}
            if trainer.datamodule is not None:
                datamodule_state = trainer.datamodule.state_dict()
                if datamodule_state:  # under the class's __qualname__, as Lightning stores it
                    checkpoint[type(trainer.datamodule).__qualname__] = datamodule_state
            trainer._call_hook("on_save_checkpoint", checkpoint)
        return checkpoint

    def save(self, path: Union[str, os.PathLike], weights_only: bool = False, asynchronous: bool = False) -> None:
        """Build and write a checkpoint; every rank builds (collectives), global rank 0 writes.

        ``asynchronous=True`` copies the state now and writes it in the background (the next save waits for it).
        During a fit, a non-finite loss recorded since the last check stops the fit here instead of saving it.
        """
        trainer = self.trainer
        strategy = trainer.strategy
        trainer._faults.before_save()
        self.raise_write_error()
        checkpoint = self.dump(weights_only)
        path = os.fspath(path)
        if asynchronous:
            strategy.save_checkpoint_async(checkpoint, path, self.writer)
        else:
            if self._writer is not None:
                self._writer.wait()  # one checkpoint at a time, in the order they were asked for
            strategy.save_checkpoint(checkpoint, path)
        strategy.barrier("save_checkpoint")
        if not weights_only:
            self.last_saved_path = path
            if self.saved_listeners:
                self.finish_writes()  # listeners get a complete checkpoint, also from an asynchronous save
                for listener in self.saved_listeners:
                    listener(path)

    @property
    def writer(self) -> Any:
        """The background writer of asynchronous saves (created on first use)."""
        if self._writer is None:
            from trainer.strategies.checkpoint.async_checkpoint import BackgroundWriter

            self._writer = BackgroundWriter()
        return self._writer

    def after_commit(self, action: Any) -> None:
        """Run ``action`` once the checkpoint being written is complete (now, after a synchronous save)."""
        if self._writer is None:
            action()
        else:
            self._writer.after_commit(action)

    def raise_write_error(self) -> None:
        """Raise the error of a background write that failed since the last look (training thread)."""
        if self._writer is not None:
            self._writer.raise_error()

    def finish_writes(self) -> None:
        """Wait for an asynchronous save in flight and raise its error, if it failed (end of a stage)."""
        if self._writer is not None:
            self._writer.wait()

    def save_interrupted(self) -> str:
        """Save ``interrupted.ckpt`` in the first checkpoint folder (what a stop signal leaves); returns its path."""
        path = self.trainer.strategy.broadcast(storage.join(self.checkpoint_folders()[0], "interrupted.ckpt"))
        self.save(path)
        return path

    def _from_every_rank(self, value: Any) -> list[Any]:
        """``value`` of every rank, in rank order (only a stateful loader's per-rank state: never per step)."""
        strategy = self.trainer.strategy
        if strategy.world_size == 1:
            return [value]
        return [strategy.broadcast(value, src=rank) for rank in range(strategy.world_size)]

    def _accumulated_grads(self) -> dict[str, Any]:
        """Gradients of an unfinished accumulation window: per rank (gathered) where they are not all-reduced yet;
        as they are where a sharded strategy already reduced them into this rank's shard (``reduced``)."""
        from trainer.strategies.checkpoint.sharded_checkpoint import is_dtensor

        strategy = self.trainer.strategy
        world_size = strategy.world_size
        params = [(name, p) for name, p in self.trainer.module.named_parameters() if p.grad is not None]
        # Already averaged across data-parallel ranks at each backward (FSDP's DTensor shards; N-D layouts, whose
        # plain gradients are replicated or another stage's), or still one per rank (DDP's no_sync window)?
        reduced = getattr(strategy, "reduces_every_backward", False) or any(is_dtensor(p.grad) for _, p in params)
        grads = {}
        for name, param in params:
            grad = param.grad.detach()
            grads[name] = strategy.all_gather(grad) if world_size > 1 and not reduced else grad
        return {"world_size": world_size, "grads": grads, "reduced": reduced}

    # ------------------------------------------------------------------ locating
    def resolve(self, ckpt_path: Union[str, os.PathLike]) -> str:
        """Turn ``"last"``/``"auto"`` (the newest good checkpoint, see :mod:`trainer.checkpoint.auto_resume`), ``"best"`` or a
        path into an existing checkpoint, or raise saying where it looked."""
        trainer = self.trainer
        if ckpt_path == "best":
            callback = trainer.checkpoint_callback
            best = getattr(callback, "best_model_path", "") if callback is not None else ""
            if not best and callback is not None:
                best = self._best_of_saved_runs(callback)
            if not best:
                raise ConfigurationError(
                    "ckpt_path='best' needs a ModelCheckpoint(monitor=...) that has saved a best checkpoint; "
                    f"{'none is configured' if callback is None else 'it has not saved one yet'}."
                )
            return str(best)
        if ckpt_path in ("last", auto_resume.AUTO):
            folders, candidates = self.last_candidates()
            found = checkpoint_lookup.newest_good(candidates)
            if found is None:
                raise NoCheckpointYet(
                    f"ckpt_path='{ckpt_path}' but no checkpoint exists yet; looked in: "
                    f"{', '.join(folders) or '(no folder)'}."
                )
            return found
        path = os.fspath(ckpt_path)
        if not storage.exists(path):
            shown = path if storage.is_remote(path) else Path(path).resolve()
            raise FileNotFoundError(f"ckpt_path='{ckpt_path}' does not exist (resolved to '{shown}').")
        verify_once(path)
        return path

    def last_candidates(self) -> tuple[list[str], list[str]]:
        """(folders looked in, the checkpoints found there, newest first) for ``"last"``/``"auto"``."""
        folders = self.checkpoint_folders()
        candidates = []
        for callback in self.trainer.checkpoint_callbacks:
            last = getattr(callback, "last_model_path", "")
            if last and storage.exists(last):
                candidates.append(last)
        for folder in folders:
            checkpoint_lookup.remove_dead_temporaries(folder)
            candidates.extend(checkpoint_lookup.checkpoints_in(folder))
        if not candidates:  # a restarted script logs to a new version_N: look in the earlier versions too
            earlier = self.earlier_run_folders()
            folders = folders + [f for f in earlier if f not in folders]
            for folder in earlier:
                candidates.extend(checkpoint_lookup.checkpoints_in(folder))
        return folders, checkpoint_lookup.newest_first(candidates)

    def _best_of_saved_runs(self, callback: Any) -> str:
        """The best checkpoint an earlier process of this experiment recorded (e.g. ``test(ckpt_path="best")`` in a
        new process after ``fit``): the ``best_model_path`` saved in the newest checkpoint file of its folders."""
        folders = self.checkpoint_folders() + self.earlier_run_folders()
        files = [p for folder in folders for p in checkpoint_lookup.checkpoints_in(folder) if storage.isfile(p)]
        if not files:
            return ""
        newest = checkpoint_lookup.newest_first(files)[0]
        try:
            states = safe_load(newest).get("callbacks") or {}
        except (CheckpointError, OSError, AttributeError):
            return ""
        ordered = [callback_state(states, callback.state_key)] + list(states.values())
        for state in ordered:
            best = state.get("best_model_path") if isinstance(state, dict) else None
            if best and storage.exists(best):
                rank_zero_info("ckpt_path='best': %s (recorded in %s).", best, newest)
                return str(best)
        return ""

    def earlier_run_folders(self) -> list[str]:
        """``checkpoints`` folders of the other ``version_N`` runs of this experiment (same logger folder)."""
        logger = self.trainer.logger
        log_dir = getattr(logger, "log_dir", None) if logger is not None else None
        if not log_dir or not _VERSION_FOLDER.fullmatch(Path(log_dir).name):
            return []
        return sorted(str(p) for p in Path(log_dir).parent.glob("version_*/checkpoints") if p.is_dir())

    def checkpoint_folders(self) -> list[str]:
        """Where this run's checkpoints live: each ModelCheckpoint's dirpath, else ``<log_dir>/checkpoints``."""
        trainer = self.trainer
        folders = [str(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)]
        return folders or [storage.join(trainer.log_dir, "checkpoints")]

    # ------------------------------------------------------------------ restoring
    def load(self, ckpt_path: Union[str, os.PathLike]) -> Optional[tuple[Path, dict[str, Any]]]:
        """Resolve, check and read a checkpoint (safely); check its format. Global rank 0 resolves and checks it
        (:mod:`trainer.checkpoint.lookup`); every rank loads what it chose.

        ``None`` for ``"last"``/``"auto"`` before any checkpoint exists (``"last"`` warns), so that always passing
        ``ckpt_path="last"`` starts fresh on the first run and resumes on the next, as in Lightning."""
        strategy = self.trainer.strategy
        found: Any = None
        if strategy.is_global_zero or strategy.world_size == 1:
            try:
                found = ("path", self.resolve(ckpt_path))
            except (FileNotFoundError, ConfigurationError, CheckpointError) as err:
                found = ("error", type(err), str(err))
        found = strategy.broadcast(found) if strategy.world_size > 1 else found
        auto = ckpt_path == auto_resume.AUTO
        if found[0] == "error" and found[1] is NoCheckpointYet:
            if auto:
                auto_resume.announce(self.trainer, None, self.checkpoint_folders())
            else:
                rank_zero_warn(f"{found[2]} Starting from the module's current weights.")
            return None
        if found[0] == "error":
            raise found[1](found[2])
        if auto:
            auto_resume.announce(self.trainer, found[1], [])
        path = found[1] if storage.is_remote(found[1]) else Path(found[1])
        checkpoint = strategy.load_checkpoint(path)
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise CheckpointError(f"'{path}' is not a trainer checkpoint (no 'state_dict' entry).")
        version = checkpoint.get("format_version", 0)
        if version > FORMAT_VERSION:
            raise CheckpointError(
                f"'{path}' has checkpoint format {version}, newer than this version understands ({FORMAT_VERSION}). "
                "Upgrade the trainer package."
            )
        return path, checkpoint

    def restore_weights(self, ckpt_path: Union[str, os.PathLike]) -> dict[str, Any]:
        """Load only the module weights (for validate/test/predict)."""
        loaded = self.load(ckpt_path)
        if loaded is None:
            return {}
        path, checkpoint = loaded
        self._load_module_state(checkpoint, path)
        self.trainer.ckpt_path = str(path)
        return checkpoint

    def reload_weights(self, path: str) -> None:
        """Put back the module weights of ``path``, a checkpoint this fit saved (every rank calls it)."""
        loaded = self.load(path)
        if loaded is not None:
            self._load_module_state(loaded[1], loaded[0])

    def restore_modules_and_callbacks(self, ckpt_path: Union[str, os.PathLike]) -> bool:
        """First half of a fit's restore, before ``configure_optimizers`` (Lightning's order): the module's
        ``on_load_checkpoint`` (it may still edit the checkpoint), the weights, the datamodule's state, then the
        callbacks' ``on_load_checkpoint`` and ``load_state_dict``. False when there is nothing to restore (``"last"``
        before any checkpoint). :meth:`restore_training_state` does the rest once the optimizers exist."""
        trainer = self.trainer
        loaded = self.load(ckpt_path)
        if loaded is None:
            return False
        path, checkpoint = loaded
        if "optimizer_states" not in checkpoint:
            raise CheckpointError(
                f"'{path}' holds weights only (saved with weights_only=True) and cannot resume training. Load the "
                "weights with Module.load_from_checkpoint(path) and start a new fit instead."
            )
        def weights_and_datamodule() -> None:
            self._load_module_state(checkpoint, path)
            self._restore_datamodule(checkpoint)

        trainer._hooks.module_then_callbacks(trainer, "on_load_checkpoint", checkpoint,
                                             before_callbacks=weights_and_datamodule)  # fmt: skip
        saved_callbacks = checkpoint.get("callbacks", {})
        for callback in trainer.callbacks:
            state = callback_state(saved_callbacks, callback.state_key)
            if state:
                callback.load_state_dict(state)
        self.restore_progress(checkpoint)  # before on_fit_start: a callback there knows the fit resumed (see docs)
        progress = trainer.fit_loop.progress
        if trainer.max_epochs not in (None, -1) and progress.epoch > trainer.max_epochs:  # as Lightning refuses
            raise ConfigurationError(
                f"You restored a checkpoint with current_epoch={progress.epoch}, but you have set "
                f"Trainer(max_epochs={trainer.max_epochs}): '{path}' is past the last epoch this fit would run. "
                f"Raise max_epochs to at least {progress.epoch} to continue from it."
            )
        self._pending = (path, checkpoint)
        return True

    def _restore_datamodule(self, checkpoint: dict[str, Any]) -> None:
        datamodule = self.trainer.datamodule
        if datamodule is not None:
            state = checkpoint.get(type(datamodule).__qualname__, checkpoint.get("datamodule"))
            if state is not None:  # "datamodule": where checkpoints of earlier versions kept it
                datamodule.load_state_dict(state)

    def restore_training_state(self) -> None:
        """Second half, after ``on_fit_start`` as in Lightning (a callback such as BaseFinetuning has re-created the
        parameter groups the saved optimizer state has): optimizers, schedulers, scaler, the gradients of a
        checkpoint saved inside an accumulation window, and the RNG to put back when training starts."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        path, checkpoint = pending
        trainer = self.trainer
        strategy = trainer.strategy
        states = checkpoint["optimizer_states"]
        if len(states) != len(trainer.optimizers):
            raise CheckpointError(
                f"'{path}' has {len(states)} optimizer state(s) but configure_optimizers returned "
                f"{len(trainer.optimizers)}."
            )
        for optimizer, state in zip(trainer.optimizers, states):
            try:
                strategy.load_optimizer_state_dict(optimizer, state)
            except KeyError as err:
                _refuse_other_optimizer(optimizer, {str(err)}, path)
            _check_same_optimizer(optimizer, path)
        for config, state in zip(trainer.lr_scheduler_configs, checkpoint.get("lr_schedulers", [])):
            config.scheduler.load_state_dict(state)
        strategy.precision.load_state_dict(checkpoint.get("precision", {}))
        self._restore_accumulated_grads(checkpoint.get("accumulated_grads"), path)
        trainer.ckpt_path = self.last_saved_path = str(path)
        self._resume = {"rng": checkpoint.get("rng"), "train_sampler": checkpoint.get("train_sampler")}
        progress = trainer.fit_loop.progress
        if trainer.fit_loop.done:
            rank_zero_info("Nothing to train: the checkpoint '%s' is already at epoch %d, step %d (max_epochs=%d, "
                           "max_steps=%d). Raise them to train further.", path, progress.epoch,
                           progress.global_step, trainer.max_epochs, trainer.max_steps)  # fmt: skip

    def restore_progress(self, checkpoint: dict[str, Any]) -> None:
        """The loops' counters and ``should_stop``; an epoch saved finished continues with the next one."""
        trainer = self.trainer
        loops = checkpoint.get("loops", {})
        progress = trainer.fit_loop.progress
        progress.load_state_dict(loops.get("fit", {}))
        trainer.should_stop = bool(loops.get("should_stop", False))
        if progress.epoch_finished:  # saved after the epoch's work was done: continue with the next epoch
            progress.epoch += 1
            progress.batch_in_epoch = 0
            progress.epoch_finished = False

    def _restore_accumulated_grads(self, saved: Optional[dict[str, Any]], path: Any) -> None:
        if not saved:
            return
        trainer = self.trainer
        world_size, rank = trainer.strategy.world_size, trainer.strategy.global_rank
        reduced = saved.get("reduced", False)  # the same on every rank, and resharded on load: any world size fits
        if not reduced and saved.get("world_size", 1) != world_size:
            rank_zero_warn(
                f"'{path}' was saved inside a gradient-accumulation window by {saved.get('world_size')} process(es); "
                f"with {world_size} now, that window's partial gradients are dropped and the resume is not exact."
            )
            return
        grads = saved.get("grads", {})
        for name, param in trainer.module.named_parameters():
            grad = grads.get(name)
            if grad is not None:
                param.grad = (grad[rank] if world_size > 1 and not reduced else grad).to(param.device, param.dtype)
        if hasattr(trainer._optimization, "window_has_loss"):
            trainer._optimization.window_has_loss = True

    def resume_point(self) -> None:
        """The training loop is about to start: a fault-tolerant strategy joins its replica groups (and may heal from
        a peer, :meth:`load_from_peer`); then the RNG of the restored checkpoint is put back (no-op otherwise)."""
        trainer = self.trainer
        trainer.strategy.join_replicas(self.dump, self.load_from_peer, trainer.fit_loop.progress.global_step)
        if self._resume is not None and self._resume.get("rng") is not None:
            restore_rng_state(self._resume["rng"])

    def load_from_peer(self, checkpoint: dict[str, Any]) -> None:
        """Heal from a live replica group's in-memory checkpoint (what its :meth:`dump` gave): weights, callbacks,
        datamodule, loop position, optimizers, schedulers, scaler; the data position and RNG are applied where the
        training iterator starts, as on a resume. No file is read and no hook runs."""
        trainer = self.trainer
        strategy = trainer.strategy
        self._load_module_state(checkpoint, "a peer replica group's state")
        self._restore_datamodule(checkpoint)
        saved_callbacks = checkpoint.get("callbacks", {})
        for callback in trainer.callbacks:
            state = callback_state(saved_callbacks, callback.state_key)
            if state:
                callback.load_state_dict(state)
        self.restore_progress(checkpoint)
        for optimizer, state in zip(trainer.optimizers, checkpoint.get("optimizer_states", [])):
            strategy.load_optimizer_state_dict(optimizer, state)
        for config, state in zip(trainer.lr_scheduler_configs, checkpoint.get("lr_schedulers", [])):
            config.scheduler.load_state_dict(state)
        strategy.precision.load_state_dict(checkpoint.get("precision", {}))
        self._resume = {"rng": checkpoint.get("rng"), "train_sampler": checkpoint.get("train_sampler")}

    def _load_module_state(self, checkpoint: dict[str, Any], path: Any) -> None:
        module = self.trainer.module
        strict = bool(getattr(module, "strict_loading", True))  # Lightning's module attribute
        expected = set(module.state_dict().keys())
        found = set(checkpoint["state_dict"].keys())
        if expected != found:
            check_state_dict(module, checkpoint["state_dict"], path, strict)
        try:
            self.trainer.strategy.load_module_state_dict(checkpoint["state_dict"], strict=strict)
        except RuntimeError as err:
            if "state_dict" not in str(err):  # not torch's "Error(s) in loading state_dict" (e.g. size mismatch)
                raise
            raise CheckpointError(f"Checkpoint '{path}' does not fit {type(module).__name__}: {err}") from None

    # ------------------------------------------------------------------ data position
    def train_iterator(self, loader: Any, epoch: int, start_batch: int) -> Iterator[Any]:
        """This epoch's training iterator, positioned after ``start_batch`` batches without loading them."""
        resume, self._resume = self._resume, None
        position = self.data_position
        position.sample_seeds = bool(getattr(self.trainer, "sample_seeds", True))
        position.rank, position.world_size = self.trainer.strategy.global_rank, self.trainer.strategy.world_size
        if resume is not None:
            position.adopt(resume.get("train_sampler"))
        if position.sample_seeds and position.run_seed is None:  # one run seed for every rank (unseeded ranks differ)
            strategy = self.trainer.strategy
            seed = torch.initial_seed()
            position.run_seed = int(strategy.broadcast(seed) if strategy.world_size > 1 else seed)
        if not start_batch:
            return self.data_position.iterator(loader, epoch)
        if resume is None:  # the same Trainer continues an epoch it stopped (e.g. a second fit with more max_steps)
            return self.data_position.iterator(loader, epoch, start_batch, self.data_position.state_dict())
        iterator = self.data_position.iterator(loader, epoch, start_batch, resume.get("train_sampler"))
        if resume.get("rng") is not None:
            restore_rng_state(resume["rng"])  # positioning replayed the sampler's draws; training continues from here
        return iterator


def callback_state(saved: dict[str, Any], state_key: str) -> Any:
    """The state saved under ``state_key``, or under the same key with its arguments sorted (how checkpoints of
    earlier versions wrote ``EarlyStopping{'mode': 'min', 'monitor': 'val_loss'}``)."""
    state = saved.get(state_key)
    if state is not None or "{" not in state_key:
        return state
    name, _, arguments = state_key.partition("{")
    try:
        wanted = ast.literal_eval("{" + arguments)
    except (ValueError, SyntaxError):
        return None
    for key, value in saved.items():
        if isinstance(key, str) and key.startswith(name + "{"):
            try:
                if ast.literal_eval(key[len(name):]) == wanted:
                    return value
            except (ValueError, SyntaxError):
                continue
    return None


def _check_same_optimizer(optimizer: Any, path: Any) -> None:
    """After loading: every setting the optimizer steps with is there. Settings a newer torch added are filled in
    by torch while loading; a missing one means the checkpoint was saved by another kind of optimizer (SGD -> Adam
    after the checkpoint), and torch would fail inside ``step()`` with a bare ``KeyError: 'betas'``."""
    needed = set(getattr(optimizer, "defaults", {}))
    for group in optimizer.param_groups:
        missing = needed - set(group)
        if missing:
            _refuse_other_optimizer(optimizer, missing, path)


def _refuse_other_optimizer(optimizer: Any, missing: set[str], path: Any) -> None:
    raise CheckpointError(
        f"The optimizer state in '{path}' was saved by a different optimizer than the {type(optimizer).__name__} "
        f"configure_optimizers returns now (the checkpoint lacks its settings {sorted(missing)}): the optimizer "
        "changed since the checkpoint was saved (e.g. SGD -> Adam), so its state cannot be restored. Go back to the "
        "optimizer the checkpoint was saved with, or start from the weights alone: "
        "model = MyModule.load_from_checkpoint(path); trainer.fit(model) without ckpt_path (the new optimizer then "
        "starts fresh)."
    )
