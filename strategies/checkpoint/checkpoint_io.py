"""Safe (``weights_only=True``) checkpoint reads, and the ``CheckpointIO`` plugin that writes, reads and deletes.

Every checkpoint read goes through :func:`safe_load`: tensors and plain Python values only, so a hostile
pickle cannot run code. Before a file is unpickled it is checked against the sizes and CRC-32s it recorded
(:mod:`trainer.strategies.checkpoint.checkpoint_manifest`). Paths may be fsspec URLs
(:mod:`trainer.strategies.checkpoint.storage`). A sharded checkpoint is a folder (see
:mod:`trainer.strategies.checkpoint.sharded_checkpoint`).

Writes are :mod:`trainer.strategies.checkpoint.atomic_write`'s (``atomic_save``, ``atomic_link``, ...); their
names, and :class:`CheckpointError`, are importable from here too.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.atomic_write import (  # noqa: F401  (re-exported: their long-standing home)
    atomic_copy,
    atomic_link,
    atomic_save,
    atomic_write_bytes,
    atomic_writer,
    remove_checkpoint,
    remove_stale_temporaries,
    replace_folder,
    temporary_name,
    writer_alive,
)
from trainer.strategies.errors import CheckpointError  # noqa: F401  (re-exported)


def safe_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """Load a checkpoint with ``torch.load(weights_only=True)`` and turn failures into clear errors.

    Raises ``FileNotFoundError`` naming the path when it does not exist, and :class:`CheckpointError`
    when the file is corrupt/truncated or holds objects that would need arbitrary code to rebuild. The
    restricted unpickler refuses such objects before constructing them, so a hostile file runs nothing.
    The file is first checked against the sizes and CRC-32s it recorded
    (:func:`trainer.strategies.checkpoint.checkpoint_manifest.verify_file`), once per file version and process.
    """
    if storage.is_remote(path):
        return _safe_load_remote(os.fspath(path), map_location)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint not found: '{path}' (resolved to '{path.resolve()}').")
    if path.is_dir():
        raise CheckpointError(
            f"'{path}' is a folder. Sharded checkpoints are folders: load them through the strategy that wrote "
            f"them, or turn them into one file with `python -m trainer checkpoint consolidate {path} out.ckpt`."
        )
    verify_once(path)
    return _load_weights_only(path, path, map_location)


_VERIFIED: dict[str, tuple[int, int]] = {}  # path -> (size, mtime) of the version already checked in this process


def verify_once(path: str | os.PathLike) -> None:
    """:func:`~trainer.strategies.checkpoint.checkpoint_manifest.verify_checkpoint` unless this version of ``path`` passed already
    in this process (the ``"last"`` lookup checks a candidate before every rank loads it)."""
    from trainer.strategies.checkpoint.checkpoint_manifest import verify_checkpoint

    key = os.fspath(path)
    stamped = key
    if storage.isdir(key):  # a folder: its manifest, rewritten by every save of it
        stamped = storage.join(key, storage.MANIFEST_FILE)
    stamp = (storage.size(stamped), storage.modified_ns(stamped)) if storage.exists(stamped) else (-1, -1)
    if _VERIFIED.get(key) == stamp:
        return
    verify_checkpoint(key)
    _VERIFIED[key] = stamp


def _safe_load_remote(url: str, map_location: Any) -> Any:
    if not storage.exists(url):
        raise FileNotFoundError(f"Checkpoint not found: '{url}'.")
    if storage.isdir(url):
        raise CheckpointError(f"'{url}' is a folder: load sharded checkpoints through the strategy that wrote them.")
    verify_once(url)
    return _load_weights_only(io.BytesIO(storage.read_bytes(url)), url, map_location)


def _load_weights_only(source: Any, path: Any, map_location: Any) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if hasattr(source, "seek"):
            source.seek(0)
        reason = _unsafe_reason(str(err), source)
        if reason is None:
            raise CheckpointError(_corrupt_message(path, err)) from None
        raise CheckpointError(
            f"Refusing to load '{path}': {reason}. A trainer checkpoint holds only tensors and plain Python values; "
            "anything else needs code from the file to run, which is how a hostile checkpoint takes over a machine. "
            "Only if you trust its origin, load it yourself with torch.load(path, weights_only=False)."
        ) from None
    except Exception as err:  # torch reports damage as RuntimeError, EOFError, KeyError, ValueError, ...
        raise CheckpointError(_corrupt_message(path, err)) from None


def _unsafe_reason(message: str, source: Any) -> Optional[str]:
    """Why the weights-only unpickler refused a file, or ``None`` when the refusal means damage."""
    found = re.search(r"GLOBAL ([\w.]+)", message)
    if found:
        return f"it asks to import and call '{found.group(1)}'"
    with contextlib.nullcontext(source) if hasattr(source, "read") else open(source, "rb") as f:
        starts_like_pickle = f.read(1) == b"\x80"  # the PROTO opcode that every pickle since protocol 2 begins with
    if starts_like_pickle and "Unsupported operand" in message:
        return "it is a raw pickle using instructions a torch.save of tensors and plain values never writes"
    return None


def _corrupt_message(path: Path, err: BaseException) -> str:
    detail = _first_line(err)
    return (
        f"Checkpoint '{path}' is corrupt or truncated and cannot be read ({type(err).__name__}"
        f"{': ' + detail if detail else ''}). If a save was interrupted, the previous checkpoint in the same "
        "folder is intact."
    )


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0].split(". ")[0][:200] if lines else ""


class CheckpointIO:
    """How a strategy writes, reads and deletes single-file checkpoints: ``Trainer(plugins=[MyCheckpointIO()])``
    (Lightning's ``CheckpointIO`` plugin). This default writes atomically and reads with ``weights_only=True``;
    override the three methods to store checkpoints elsewhere (an object store, a compressed format)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        """Write ``checkpoint`` to ``path`` (called on global rank 0 only)."""
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
        """Read the checkpoint at ``path``."""
        return safe_load(path, map_location=map_location)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Delete the checkpoint at ``path`` (one that is already gone is not an error)."""
        remove_checkpoint(path)
