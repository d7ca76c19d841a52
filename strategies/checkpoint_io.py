"""Atomic checkpoint writes and safe (``weights_only=True``) reads.

Every file the framework writes goes through :func:`atomic_save`: a temporary file in the destination
folder, flushed and fsynced, then renamed over the target, so a crash mid-write leaves the previous file
intact. Every checkpoint read goes through :func:`safe_load`: tensors and plain Python values only, so a
hostile pickle cannot run code.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import torch


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be used (corrupt, truncated or unsafe)."""


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not all platforms can open a directory
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(target.parent)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` ``obj`` to ``path`` atomically: readers see the old file or the new one, never half."""
    with _atomic_file(path) as f:
        torch.save(obj, f)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy ``src`` to ``dst`` atomically (used to refresh ``last.ckpt`` without a half-written window)."""
    with open(src, "rb") as source, _atomic_file(dst) as f:
        shutil.copyfileobj(source, f, length=16 * 1024 * 1024)


def safe_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """Load a checkpoint with ``torch.load(weights_only=True)`` and turn failures into clear errors.

    Raises ``FileNotFoundError`` naming the path when it does not exist, and :class:`CheckpointError`
    when the file is corrupt/truncated or holds objects that would need arbitrary code to rebuild.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint not found: '{path}' (resolved to '{path.resolve()}').")
    if path.is_dir():
        raise CheckpointError(
            f"'{path}' is a folder. Sharded checkpoints are folders: load them through the strategy that wrote "
            f"them, or turn them into one file with `python -m trainer checkpoint consolidate {path} out.ckpt`."
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"Refusing to load '{path}': it contains objects other than tensors and plain Python values, and "
            f"rebuilding them would execute code from the file ({_first_line(err)}). Only load such a file if "
            "you trust its origin, with torch.load(path, weights_only=False) yourself."
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise CheckpointError(
            f"Checkpoint '{path}' is corrupt or truncated and cannot be read ({_first_line(err)}). "
            "If a save was interrupted, the previous checkpoint in the same folder is intact."
        ) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__
