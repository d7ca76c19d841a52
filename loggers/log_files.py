"""Writing log files so that a failed write (a full disk, a file-size limit, a read-only folder) stops the run with one
short error naming the file, and leaves no half-written or empty temporary behind.

Small whole files (``hparams.yaml``, a rewritten ``metrics.csv``) are written to a temporary beside the target and
renamed over it, as checkpoints are (:mod:`trainer.strategies.checkpoint.checkpoint_io`, whose temporary naming this
reuses); the temporary is removed when the write fails.
"""
from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any, Callable, TextIO

from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.checkpoint_io import temporary_name


class LogWriteError(OSError):
    """A logger could not write its file; ``errno`` is the operating system's (``ENOSPC``: the disk is full)."""

    def __init__(self, errno: int, message: str, path: str) -> None:
        super().__init__(errno, message)
        self.log_path = path

    def __str__(self) -> str:
        return str(self.strerror)


def log_write_error(err: OSError, path: Any, what: str = "log file") -> LogWriteError:
    """``err`` (raised writing ``path``) as a :class:`LogWriteError` whose message names the file and what to do.
    Raise it ``from None``: the chain of the same error through the writer's internals says nothing more."""
    if isinstance(err, LogWriteError):
        return err
    reason = err.strerror or str(err)
    return LogWriteError(
        err.errno or 0,
        f"Could not write {what} '{os.fspath(path)}': {reason}. Free space there (or raise the file-size limit), or "
        "point the logger elsewhere (its save_dir, or Trainer(default_root_dir=...)); logger=False runs without one.",
        os.fspath(path),
    )


def write_text_atomically(path: str, write: Callable[[TextIO], None], newline: str | None = None) -> None:
    """Call ``write`` on a temporary beside ``path`` and rename it over ``path``: readers see the old file or the new
    one. A failed write removes the temporary and raises :class:`LogWriteError` naming ``path``. On an fsspec URL the
    text is uploaded under a temporary name and copied into place (:func:`storage.remote_atomic_write`)."""
    if storage.is_remote(path):
        text = io.StringIO(newline=newline)
        write(text)
        try:
            with storage.remote_atomic_write(path) as fh:
                fh.write(text.getvalue().encode("utf-8"))
        except OSError as err:
            raise log_write_error(err, path) from None
        return
    target = Path(path)
    tmp = temporary_name(target)
    try:
        with open(tmp, "w", encoding="utf-8", newline=newline) as fh:
            write(fh)
        os.replace(tmp, target)
    except OSError as err:
        raise log_write_error(err, path) from None
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()


_quiet_threads_installed = False


def quiet_writer_threads() -> None:
    """TensorBoard writes from a thread of its own, and a failed write there is printed in full by
    ``threading.excepthook`` before the same error is raised again in the training process (where the logger names
    the file). Skip that first print, for TensorBoard's writer thread and ``OSError`` only."""
    global _quiet_threads_installed
    if _quiet_threads_installed:
        return
    _quiet_threads_installed = True
    previous = threading.excepthook

    def hook(args: Any) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        previous(args)

    threading.excepthook = hook
