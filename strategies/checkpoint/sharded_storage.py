"""Where a sharded checkpoint folder is written and how it is committed, on a local disk or an fsspec URL.

The ranks write into a temporary folder beside the target; global rank 0 then writes the rest of the
checkpoint (``meta.pt``) and the manifest (:mod:`trainer.strategies.checkpoint.checkpoint_manifest`, sizes and CRC-32s of every
file) and commits: a rename locally, an object-by-object copy with the manifest last remotely.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.checkpoint_io import (
    atomic_save,
    remove_stale_temporaries,
    replace_folder,
    temporary_name,
)


def temporary_folder(target: str) -> str:
    """The temporary folder the ranks write ``target`` into (global rank 0's choice, broadcast)."""
    if storage.is_remote(target):
        return storage.temporary_remote_name(target)
    return str(temporary_name(Path(target)))


def prepare_folder(target: str, tmp: str) -> None:
    """Global rank 0: remove what a killed writer left, create the temporary folder."""
    if storage.is_remote(target):
        storage.remove_stale_remote_temporaries(target)
        storage.makedirs(tmp)
        return
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(Path(target))
    Path(tmp).mkdir()


def dcp_writer(tmp: str) -> Any:
    """DCP's writer for the temporary folder (files synced before the save counts as done)."""
    if storage.is_remote(tmp):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(tmp, sync_files=True)
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(tmp, sync_files=True)


def commit_folder(meta: dict[str, Any], tmp: str, target: str, meta_file: str, info: dict[str, Any]) -> None:
    """Global rank 0, after every rank's shards are written: ``meta.pt``, the manifest, then the commit."""
    from trainer.strategies.checkpoint.checkpoint_manifest import write_folder_manifest

    atomic_save(meta, storage.join(tmp, meta_file))
    write_folder_manifest(tmp, {"sharded_checkpoint": info})
    if storage.is_remote(target):
        storage.remove(target)
        storage.copy_remote(tmp, target)
        storage.remove(tmp)
    else:
        replace_folder(tmp, target)


def reader_base(path: str) -> type:
    """DCP's reader class for ``path`` (fsspec for URLs)."""
    if storage.is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader


def is_folder(path: Any) -> bool:
    """Whether ``path`` (local or a URL) is a folder."""
    return storage.isdir(path) if storage.is_remote(path) else os.path.isdir(path)
