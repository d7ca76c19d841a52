"""What a checkpoint holds, recorded when it is written and checked before it is loaded.

- **A full file** is ``torch.save``'s zip: its central directory, written last, lists every record (the pickled
  dict and each tensor's storage) with its size and CRC-32, which ``torch.save`` computes as it writes (in the
  writer thread when the save is asynchronous), so recording them costs nothing extra. ``torch.load`` checks
  neither: a flipped byte inside a tensor loads silently. :func:`verify_file` reads every record against the
  directory (zlib's CRC-32, about 3 GB/s: ~30 ms for 100 MB, paid once per load, not per save).
- **A sharded folder** gets ``manifest.json``, written last by global rank 0, with the size and CRC-32 of every
  file in it (:func:`write_folder_manifest`). A folder without it is unfinished (or older than manifests: a
  local folder from before them still loads, unchecked).

A truncated or corrupted checkpoint is refused with a :class:`~trainer.strategies.errors.CheckpointError` naming
the file and what is wrong; ``ckpt_path="last"``/``"auto"`` then fall back to the previous good checkpoint.
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Any, Optional

from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.atomic_write import atomic_write_bytes
from trainer.strategies.checkpoint.storage import MANIFEST_FILE
from trainer.strategies.errors import CheckpointError

MANIFEST_VERSION = 1
_CHUNK = 1024 * 1024  # small: a large read buffer would add its size to peak memory at every check
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = b"\x80"  # torch.save(..., _use_new_zipfile_serialization=False): a bare pickle, nothing recorded


def crc32_of(stream: Any) -> tuple[int, int]:
    """(CRC-32, size) of everything ``stream`` yields from its current position."""
    crc, total = 0, 0
    while True:
        block = stream.read(_CHUNK)
        if not block:
            return crc, total
        crc = zlib.crc32(block, crc)
        total += len(block)


def verify_file(path: storage.PathLike) -> None:
    """Check a full checkpoint file against the sizes and CRC-32s its zip directory records."""
    with storage.open_read(path) as f:
        head = f.read(4)
        f.seek(0)
        if head[:1] == _LEGACY_MAGIC:
            return
        if head != _ZIP_MAGIC:
            what = "is empty" if not head else "does not start like a checkpoint (torch.save's zip format)"
            raise CheckpointError(f"Checkpoint '{path}' {what}; it is truncated or not a checkpoint file.") from None
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError):
            raise CheckpointError(
                f"Checkpoint '{path}' is truncated: the record directory that torch.save writes at its end is "
                f"missing ({storage.size(path)} bytes are there). The save that wrote it did not finish; the "
                "previous checkpoint in the same folder is intact."
            ) from None
        for info in archive.infolist():
            try:
                with archive.open(info) as member:
                    while member.read(_CHUNK):
                        pass
            except zipfile.BadZipFile as err:
                problem = "fails its CRC-32 check (the bytes changed after it was written)" if "CRC" in str(err) \
                    else f"is damaged ({err})"  # fmt: skip
                raise CheckpointError(
                    f"Checkpoint '{path}' is corrupted: record '{info.filename}' ({info.file_size} bytes) {problem}."
                ) from None
            except (EOFError, OSError, zlib.error) as err:
                raise CheckpointError(
                    f"Checkpoint '{path}' is truncated: record '{info.filename}' ({info.file_size} bytes) ends "
                    f"early ({type(err).__name__})."
                ) from None


def _folder_files(folder: str) -> dict[str, str]:
    """Relative name → full path of every file under ``folder`` except the manifest."""
    found: dict[str, str] = {}
    if storage.is_remote(folder):
        fs, inner = storage.filesystem(folder)
        root = inner.rstrip("/")
        for path in fs.find(root):
            found[path[len(root) + 1:]] = storage.join(folder, path[len(root) + 1:])
    else:
        for base, _, names in os.walk(folder):
            for entry in names:
                full = os.path.join(base, entry)
                found[os.path.relpath(full, folder)] = full
    found.pop(MANIFEST_FILE, None)
    return found


def write_folder_manifest(folder: str, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Record the size and CRC-32 of every file in ``folder`` in its ``manifest.json`` (written last)."""
    files = {}
    for relative, path in sorted(_folder_files(folder).items()):
        with storage.open_read(path) as f:
            crc, length = crc32_of(f)
        files[relative] = {"size": length, "crc32": f"{crc:08x}"}
    manifest = {"manifest_version": MANIFEST_VERSION, "files": files, **(extra or {})}
    atomic_write_bytes(json.dumps(manifest, indent=1, sort_keys=True).encode(), storage.join(folder, MANIFEST_FILE))
    return manifest


def read_folder_manifest(folder: str) -> Optional[dict[str, Any]]:
    """The folder's manifest, or ``None`` when it has none."""
    path = storage.join(folder, MANIFEST_FILE)
    if not storage.exists(path):
        return None
    try:
        manifest = json.loads(storage.read_bytes(path))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"Checkpoint folder '{folder}' has a damaged {MANIFEST_FILE} ({err}).") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"Checkpoint folder '{folder}' has a {MANIFEST_FILE} without its file list.")
    return manifest


def verify_folder(folder: storage.PathLike) -> None:
    """Check every file of a sharded folder against its manifest (sizes first, then CRC-32s)."""
    folder = os.fspath(folder)
    manifest = read_folder_manifest(folder)
    if manifest is None:
        if storage.is_remote(folder):
            raise CheckpointError(
                f"Checkpoint folder '{folder}' has no {MANIFEST_FILE}: its upload did not finish (the manifest is "
                "copied last)."
            )
        return  # a local folder written before manifests existed: renamed into place whole, nothing recorded
    listed = manifest["files"]
    for relative, record in listed.items():
        path = storage.join(folder, relative)
        if not storage.exists(path):
            raise CheckpointError(f"Checkpoint folder '{folder}' is incomplete: '{relative}' is missing.")
        actual = storage.size(path)
        if actual != record["size"]:
            raise CheckpointError(
                f"Checkpoint folder '{folder}' is damaged: '{relative}' has {actual} bytes, the manifest records "
                f"{record['size']} (truncated or overwritten)."
            )
    for relative, record in listed.items():
        with storage.open_read(storage.join(folder, relative)) as f:
            crc, _ = crc32_of(f)
        if f"{crc:08x}" != record["crc32"]:
            raise CheckpointError(
                f"Checkpoint folder '{folder}' is corrupted: '{relative}' fails its CRC-32 check (the bytes "
                "changed after it was written)."
            )


def verify_checkpoint(path: storage.PathLike) -> None:
    """Check a checkpoint file or sharded folder against what it recorded when it was written."""
    if storage.isdir(path):
        verify_folder(path)
    else:
        verify_file(path)
