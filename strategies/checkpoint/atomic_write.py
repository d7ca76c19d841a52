"""Atomic checkpoint writes: a reader sees the previous file or folder or the new one, never half of one.

Every file the framework writes goes through :func:`atomic_save`: a temporary file in the destination
folder, flushed and fsynced, then renamed over the target, so a crash mid-write leaves the previous file
intact. :func:`atomic_link`, :func:`remove_checkpoint` and :func:`replace_folder` accept folders (sharded
checkpoints) as well as files. Paths may be fsspec URLs (:mod:`trainer.strategies.checkpoint.storage`): the same
functions then upload under a temporary name and commit last. Reading is
:mod:`trainer.strategies.checkpoint.checkpoint_io`'s.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

import torch

from trainer.strategies.checkpoint import storage


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
    remove_stale_temporaries(target)
    tmp = temporary_name(target)
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


def temporary_name(target: Path) -> Path:
    """Where a writer of ``target`` in this process puts its work before renaming it into place."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


def remove_stale_temporaries(target: Path) -> None:
    """Delete temporaries (files or folders) of ``target`` left by this process or by a writer that was killed
    mid-save. Another live process's temporary is its in-flight save (e.g. a second run writing into the same
    folder): it is left alone."""
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*-*"):
        kind, _, pid = stale.name[len(target.name) + 2:].partition("-")
        if kind in ("tmp", "old") and pid.isdigit() and not writer_alive(int(pid)):
            _remove_path(stale)


def writer_alive(pid: int) -> bool:
    """Whether the process ``pid`` that named a temporary still runs elsewhere (this process's own are stale:
    it writes one checkpoint of a name at a time)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by another user
        return True
    return True


_writes_in_progress = 0  # atomic writes running in this process (any thread); read by the Ctrl-C handler


def writing_checkpoint() -> bool:
    """Whether this process is writing a file through :func:`atomic_writer` right now (a second Ctrl-C then stops
    at once instead of raising inside the writer)."""
    return _writes_in_progress > 0


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary stream whose content replaces ``path`` whole once the block ends without an error.

    A write that fails (a full disk, a file-size limit) leaves the previous file in place and raises an
    ``OSError`` that names the checkpoint."""
    global _writes_in_progress
    _writes_in_progress += 1
    try:
        if storage.is_remote(path):
            storage.remove_stale_remote_temporaries(os.fspath(path))
            with storage.remote_atomic_write(os.fspath(path)) as f:
                yield f
        else:
            with _atomic_file(path) as f:
                yield f
    except (OSError, RuntimeError) as err:
        cause = _os_error(err)  # torch.save reports a failed write as RuntimeError("unexpected pos ...")
        if cause is None or cause.errno is None or getattr(err, "checkpoint_path", None) is not None:
            raise
        named = OSError(cause.errno, f"Could not write checkpoint '{path}': {cause.strerror or cause}. Nothing was "
                                     "replaced: the previous checkpoint of that name (if any) is intact.")  # fmt: skip
        named.checkpoint_path = os.fspath(path)  # type: ignore[attr-defined]
        raise named from err
    finally:
        _writes_in_progress -= 1


def _os_error(err: Optional[BaseException]) -> Optional[OSError]:
    """The ``OSError`` that ``err`` is or was raised while handling (a full disk, a file-size limit)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError):
            return err
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` ``obj`` to ``path`` atomically: readers see the old file or the new one, never half."""
    with atomic_writer(path) as f:
        torch.save(obj, f)


def atomic_write_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Write ``data`` to ``path`` atomically (small files: manifests)."""
    with atomic_writer(path) as f:
        f.write(data)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy ``src`` to ``dst`` atomically (used to refresh ``last.ckpt`` without a half-written window)."""
    with open(src, "rb") as source, _atomic_file(dst) as f:
        shutil.copyfileobj(source, f, length=16 * 1024 * 1024)


def atomic_link(src: str | os.PathLike, dst: str | os.PathLike, symbolic: bool = False) -> None:
    """Make ``dst`` name the same file as ``src``, atomically; never a moment without a complete ``dst``.

    A hard link (the default) costs no copy and survives the later deletion of ``src``; where the file
    system refuses hard links, the file is copied. ``symbolic=True`` makes a relative symbolic link. A folder
    (a sharded checkpoint) becomes a new folder of hard links to its files, swapped in by :func:`replace_folder`.
    """
    if storage.is_remote(src) or storage.is_remote(dst):
        _remote_link(os.fspath(src), os.fspath(dst))
        return
    source, target = Path(src), Path(dst)
    if source.resolve() == target.resolve():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(target)
    _remove_path(tmp)
    if source.is_dir() or target.is_dir():
        if symbolic:
            os.symlink(os.path.relpath(source.resolve(), target.parent.resolve()), tmp)
        else:
            shutil.copytree(source, tmp, copy_function=_link_or_copy)
        replace_folder(tmp, target)
        return
    try:
        if symbolic:
            os.symlink(os.path.relpath(source.resolve(), target.parent.resolve()), tmp)
        else:
            os.link(source, tmp)
    except OSError:
        if symbolic:
            raise
        atomic_copy(source, target)
        return
    os.replace(tmp, target)
    _fsync_dir(target.parent)


def _remote_link(src: str, dst: str) -> None:
    """Object stores have no links: a server-side copy; a folder is replaced with its manifest copied last."""
    if src.rstrip("/") == dst.rstrip("/"):
        return
    if storage.isdir(src):
        storage.remove(dst)
    storage.copy_remote(src, dst)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def replace_folder(tmp: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename the finished folder (or link) ``tmp`` to ``target``, replacing what is there.

    A folder cannot be renamed over a non-empty folder, so an existing ``target`` is first renamed aside and
    deleted after the swap: between the two renames (microseconds) ``target`` is missing, but it is never
    half-written.
    """
    tmp, target = Path(tmp), Path(target)
    if tmp.is_dir() and not tmp.is_symlink():
        _fsync_dir(tmp)
    if not os.path.lexists(target):
        os.replace(tmp, target)
    else:
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        _remove_path(old)
        os.replace(target, old)
        os.replace(tmp, target)
        _remove_path(old)
    _fsync_dir(target.parent)


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_checkpoint(path: str | os.PathLike) -> None:
    """Delete a checkpoint file, link or sharded-checkpoint folder; one that is already gone is not an error."""
    if storage.is_remote(path):
        storage.remove(os.fspath(path))
        return
    _remove_path(Path(path))
