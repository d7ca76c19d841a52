"""Where checkpoints live: local paths, or fsspec URLs (``s3://bucket/run``, ``gs://...``, ``memory://`` in tests).

A URL is any ``scheme://...`` other than ``file://``; its file system comes from fsspec (``pip install
'trainer[s3]'`` brings fsspec and s3fs), imported on first use so local training never pays for it. The
functions here take either kind and do the same thing; on a local path they are the plain ``os`` calls the
rest of the code used before URLs were accepted.

Object stores have no atomic rename: a remote file is uploaded under a temporary name and then copied to its
name (one server-side copy, which an object store commits whole) before the temporary is deleted. A remote
sharded folder is committed object by object with its manifest copied last (:mod:`trainer.strategies.checkpoint.checkpoint_manifest`):
a folder without its manifest is an unfinished one and is never loaded or picked by ``ckpt_path="last"``.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Any, BinaryIO, Callable, Iterator, Union

from trainer.strategies.errors import ConfigurationError

PathLike = Union[str, "os.PathLike[str]"]
#: The file a sharded folder's writer commits last (:mod:`trainer.strategies.checkpoint.checkpoint_manifest`): copies
#: order it last too, so a folder holding it is complete.
MANIFEST_FILE = "manifest.json"
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def is_remote(path: Any) -> bool:
    """True for an fsspec URL (``s3://...``); False for a local path or a ``file://`` URL."""
    if not isinstance(path, str):
        return False
    found = _URL.match(path)
    return found is not None and found.group(1).lower() != "file"


def local_path(path: PathLike) -> str:
    """``path`` as a string; ``file://`` URLs become plain paths."""
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path inside it (a clear error when fsspec is missing)."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise ConfigurationError(
            f"'{url}' is a URL, which needs fsspec (and, for s3://, s3fs): pip install 'trainer[s3]'."
        ) from None
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as err:
        raise ConfigurationError(f"Cannot open '{url}': {err} (for s3:// URLs: pip install 'trainer[s3]').") from None


def _fresh(url: str) -> tuple[Any, str]:
    """:func:`filesystem`, with fsspec's listing cache for ``url`` dropped: another process (a writer, a restarted
    job) may have changed the object since this one last looked."""
    fs, inner = filesystem(url)
    fs.invalidate_cache(inner)
    return fs, inner


def join(base: PathLike, *names: str) -> str:
    """``base/names...`` for a folder or URL."""
    base = os.fspath(base)
    if is_remote(base):
        return "/".join([base.rstrip("/"), *names])
    return os.path.join(base, *names)


def parent(path: PathLike) -> str:
    """The folder holding ``path``."""
    path = os.fspath(path)
    if is_remote(path):
        return path.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(path)


def name(path: PathLike) -> str:
    """The last component of ``path``."""
    return os.fspath(path).rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


def _ask(path: PathLike, remote: str, local: Callable[[str], Any]) -> Any:
    """``fs.<remote>(path)`` for a URL (read fresh), ``local(path)`` for a local path."""
    if is_remote(path):
        fs, inner = _fresh(os.fspath(path))
        return getattr(fs, remote)(inner)
    return local(local_path(path))


def exists(path: PathLike) -> bool:
    """Whether a file or folder is at ``path``."""
    return bool(_ask(path, "exists", os.path.lexists))


def isdir(path: PathLike) -> bool:
    """Whether ``path`` is a folder (a prefix holding objects, remotely)."""
    return bool(_ask(path, "isdir", os.path.isdir))


def isfile(path: PathLike) -> bool:
    """Whether ``path`` is a file (an object, remotely)."""
    return bool(_ask(path, "isfile", os.path.isfile))


def size(path: PathLike) -> int:
    """Bytes in the file at ``path``."""
    return int(_ask(path, "size", os.path.getsize))


def listdir(folder: PathLike) -> list[str]:
    """Full paths (URLs, remotely) of what ``folder`` holds; empty when it does not exist."""
    folder = os.fspath(folder)
    if is_remote(folder):
        fs, inner = _fresh(folder)
        try:
            entries = fs.ls(inner, detail=False)
        except FileNotFoundError:
            return []
        return sorted(join(folder, str(entry).rstrip("/").rsplit("/", 1)[-1]) for entry in entries
                      if str(entry).rstrip("/") != inner.rstrip("/"))  # fmt: skip
    try:
        return sorted(os.path.join(folder, entry) for entry in os.listdir(local_path(folder)))
    except (FileNotFoundError, NotADirectoryError):
        return []


def modified_ns(path: PathLike) -> int:
    """When ``path`` was last written, in nanoseconds (0 where the file system does not say)."""
    if is_remote(path):
        fs, inner = _fresh(os.fspath(path))
        try:
            stamp = fs.modified(inner)
        except (NotImplementedError, FileNotFoundError, IsADirectoryError, OSError):
            return 0
        return int(stamp.timestamp() * 1e9)
    return os.stat(local_path(path)).st_mtime_ns


def makedirs(folder: PathLike) -> None:
    """Create ``folder`` and its parents (object stores need none: a no-op there)."""
    if is_remote(folder):
        fs, inner = filesystem(os.fspath(folder))
        with contextlib.suppress(FileExistsError):
            fs.makedirs(inner, exist_ok=True)
        return
    os.makedirs(local_path(folder), exist_ok=True)


def remove(path: PathLike) -> None:
    """Delete a remote file or folder; one that is already gone is not an error."""
    fs, inner = filesystem(os.fspath(path))
    with contextlib.suppress(FileNotFoundError):
        if fs.isdir(inner):
            fs.rm(inner, recursive=True)
        elif fs.exists(inner):
            fs.rm(inner)


def read_bytes(path: PathLike) -> bytes:
    """The whole content of the file at ``path``."""
    if is_remote(path):
        fs, inner = _fresh(os.fspath(path))
        return fs.cat_file(inner)
    with open(local_path(path), "rb") as f:
        return f.read()


@contextlib.contextmanager
def open_read(path: PathLike) -> Iterator[BinaryIO]:
    """A seekable binary reader of the file at ``path``."""
    if is_remote(path):
        fs, inner = _fresh(os.fspath(path))
        with fs.open(inner, "rb") as f:
            yield f
        return
    with open(local_path(path), "rb") as f:
        yield f


@contextlib.contextmanager
def remote_atomic_write(url: str) -> Iterator[BinaryIO]:
    """Write the object ``url`` whole or not at all: upload to a temporary name, then copy it into place."""
    fs, inner = filesystem(url)
    tmp = temporary_remote_name(url)
    _, tmp_inner = filesystem(tmp)
    try:
        with fs.open(tmp_inner, "wb") as f:
            yield f
        fs.copy(tmp_inner, inner)
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(tmp_inner)


def temporary_remote_name(url: str) -> str:
    """Where a writer of ``url`` in this process puts its work before committing it."""
    return join(parent(url), f".{name(url)}.tmp-{os.getpid()}")


def remove_stale_remote_temporaries(url: str) -> None:
    """Delete what an earlier write of ``url`` by this process left under its temporary name. Others' are left
    alone: a store shared by several machines has no process ids to check, and one may be another run's
    in-flight save."""
    own = name(temporary_remote_name(url))
    for entry in listdir(parent(url)):
        if name(entry) == own:
            remove(entry)


def copy_remote(src: str, dst: str) -> None:
    """Copy the remote file or folder ``src`` to ``dst`` (server-side where the store can); a folder's
    manifest goes last, so the copy is complete once it is there."""
    fs, src_inner = filesystem(src)
    _, dst_inner = filesystem(dst)
    if not fs.isdir(src_inner):
        fs.copy(src_inner, dst_inner)
        return
    files = sorted(fs.find(src_inner), key=lambda p: p.rsplit("/", 1)[-1] == MANIFEST_FILE)
    for path in files:
        relative = path[len(src_inner.rstrip("/")) + 1:]
        fs.copy(path, dst_inner.rstrip("/") + "/" + relative)


def commit_remote_folder(tmp: str, target: str) -> None:
    """Move the finished remote folder ``tmp`` to ``target``, replacing what is there, manifest last."""
    remove(target)
    copy_remote(tmp, target)
    remove(tmp)

