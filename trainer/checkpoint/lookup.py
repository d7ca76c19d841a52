"""Finding the newest good checkpoint of a run (``ckpt_path="last"``/``"auto"``; policy in :mod:`trainer.checkpoint.auto_resume`).

Candidates are the ``*.ckpt`` files and sharded folders in the run's checkpoint folders, local or fsspec URLs
(:mod:`trainer.strategies.checkpoint.storage`), newest first. Each is checked against what it recorded when it was written
(:func:`trainer.strategies.checkpoint.checkpoint_io.verify_once`) before it is chosen; a damaged one is skipped with a warning.
"""
from __future__ import annotations

import os
import re
from typing import Iterable, Optional

from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, verify_once
from trainer.strategies.checkpoint.checkpoint_manifest import MANIFEST_FILE
from trainer.strategies.rank import rank_zero_warn

EXTENSION = ".ckpt"
_TEMPORARY = re.compile(r"^\..+\.ckpt\.(tmp|old)-(\d+)$")  # checkpoint_io.temporary_name and replace_folder's


def checkpoints_in(folder: str) -> list[str]:
    """The checkpoints (files and sharded folders named ``*.ckpt``) directly in ``folder``."""
    return [path for path in storage.listdir(folder)
            if storage.name(path).endswith(EXTENSION) and not storage.name(path).startswith(".")]  # fmt: skip


def remove_dead_temporaries(folder: str) -> None:
    """Delete the temporaries that writers killed mid-save left in a local ``folder`` (their process is gone)."""
    from trainer.strategies.checkpoint.checkpoint_io import remove_checkpoint

    if storage.is_remote(folder):
        return  # no process ids to check there; a later save of the same name replaces its temporary
    for path in storage.listdir(folder):
        found = _TEMPORARY.match(storage.name(path))
        if found and not _alive(int(found.group(2))):
            remove_checkpoint(path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def written_at(path: str) -> int:
    """When the checkpoint at ``path`` was completed (a remote folder: when its manifest, copied last, landed)."""
    if storage.is_remote(path) and storage.isdir(path):
        return storage.modified_ns(storage.join(path, MANIFEST_FILE)) if storage.exists(
            storage.join(path, MANIFEST_FILE)) else 0  # fmt: skip
    return storage.modified_ns(path)


def newest_first(paths: Iterable[str]) -> list[str]:
    """``paths`` ordered newest first; on a tie (``last.ckpt`` is a hard link or copy) the ``last`` name first."""
    unique = list(dict.fromkeys(p for p in paths if storage.exists(p)))
    return sorted(unique, key=lambda p: (written_at(p), storage.name(p).startswith("last")), reverse=True)


def newest_good(candidates: list[str]) -> Optional[str]:
    """The first of ``candidates`` (newest first) that passes its check; ``None`` when there are none.

    Raises :class:`CheckpointError` when there are candidates but every one is damaged."""
    problems: list[str] = []
    bad_files: set[tuple[int, int]] = set()  # (device, inode): a hard-linked last.ckpt is its original
    for path in candidates:
        identity = _identity(path)
        if identity is not None and identity in bad_files:
            continue
        try:
            verify_once(path)
        except CheckpointError as err:
            if identity is not None:
                bad_files.add(identity)
            problems.append(str(err))
            rank_zero_warn(f"Skipping a damaged checkpoint: {err} Falling back to the previous one.")
            continue
        return path
    if problems:
        raise CheckpointError(
            f"Every checkpoint of this run is damaged, so there is nothing good to resume from: {' '.join(problems)} "
            "Pass ckpt_path=<file> to choose one yourself, or ckpt_path=None to start over."
        )
    return None


def _identity(path: str) -> Optional[tuple[int, int]]:
    if storage.is_remote(path):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
