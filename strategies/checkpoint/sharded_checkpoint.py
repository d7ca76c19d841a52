"""Sharded checkpoints: a folder written with ``torch.distributed.checkpoint`` (DCP), each rank writing its shards.

Layout of ``NAME.ckpt/``::

    .metadata, __0_0.distcp, __1_0.distcp, ...   DCP: every tensor of the checkpoint's ``state_dict``,
                                                 ``optimizer_states`` and ``accumulated_grads``; each rank
                                                 writes what it holds, a replicated tensor is written once
    meta.pt                                      the rest of the checkpoint (epoch, loops, rng, callbacks,
                                                 optimizer hyperparameters, ...), written by global rank 0

Tensors are stored under ``section/key/...`` paths (``state_dict/net.0.weight``,
``optimizer_states/0/state/net.0.weight/exp_avg``). Optimizer states are keyed by parameter name (DCP's
format) rather than by index, which is what lets DCP reshard them: a folder written by N ranks loads into M
ranks, into another sharded strategy, or into one process (:func:`load_full`, :func:`consolidate`).

Writes are atomic: the ranks write into a temporary folder beside the target, which global rank 0 renames
once every rank has finished, after writing ``manifest.json`` (the size and CRC-32 of every file, checked before
a load) last (:mod:`trainer.strategies.checkpoint.sharded_storage`; also for fsspec URLs). With a :class:`BackgroundWriter` the
shards go through ``dcp.async_save`` and the commit happens in the writer thread. Reads are safe: DCP's ``.metadata`` is unpickled through an allow-list of the
classes it consists of, tensors are read with ``weights_only=True`` and ``meta.pt`` through ``safe_load``;
DCP entries that would be unpickled as arbitrary objects are refused.
"""
from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.checkpoint import sharded_storage

from trainer.strategies.checkpoint import storage
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, atomic_save, safe_load, verify_once
from trainer.strategies.errors import ConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    from trainer.strategies.checkpoint.async_checkpoint import BackgroundWriter

SHARDED_SECTIONS = ("state_dict", "optimizer_states", "accumulated_grads")
META_FILE = "meta.pt"
FORMAT_VERSION = 1
STATE_DICT_TYPES = ("sharded", "full")
_HOLE = None  # where a tensor sat in a list of the skeleton


class Ranks(Protocol):
    """What writing a sharded folder needs of the strategy (every ``Strategy`` is one): who is global rank 0, how
    many ranks there are, and the two collectives. Described here, since the checkpoint package sits below the
    strategy interface."""

    @property
    def world_size(self) -> int: ...

    @property
    def is_global_zero(self) -> bool: ...

    def barrier(self, name: Optional[str] = None) -> None: ...

    def broadcast(self, obj: Any, src: int = 0) -> Any: ...


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` is a folder written by :func:`save_sharded`."""
    if storage.is_remote(path):
        return storage.isfile(storage.join(path, ".metadata")) and storage.isfile(storage.join(path, META_FILE))
    path = Path(path)
    return path.is_dir() and (path / ".metadata").is_file() and (path / META_FILE).is_file()


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a DTensor, without importing DTensor when nothing created one."""
    module = __import__("sys").modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def check_state_dict_type(value: str) -> str:
    """Validate a strategy's ``state_dict_type`` argument."""
    if value not in STATE_DICT_TYPES:
        raise ConfigurationError(
            f"state_dict_type={value!r} is not known. Use 'sharded' (a folder, each rank writes its shards) or "
            "'full' (one file, gathered on global rank 0)."
        )
    return value


# ---------------------------------------------------------------------------------------------- structure
def _split(obj: Any, path: tuple = ()) -> tuple[Any, dict[str, Tensor]]:
    """Separate the tensors of a nested dict/list (returned by ``/``-joined path) from the rest (the skeleton)."""
    if isinstance(obj, Tensor):
        return _HOLE, {_key(path): obj}
    tensors: dict[str, Tensor] = {}
    if isinstance(obj, dict):
        skeleton = {}
        for k, v in obj.items():
            part, found = _split(v, path + (k,))
            tensors.update(found)
            if not isinstance(v, Tensor):
                skeleton[k] = part
        return skeleton, tensors
    if isinstance(obj, (list, tuple)):
        parts = []
        for i, v in enumerate(obj):
            part, found = _split(v, path + (i,))
            tensors.update(found)
            parts.append(part)
        keep_tuple = type(obj) is tuple and not tensors  # e.g. Adam's betas; a list where tensors go back in
        return (tuple(parts) if keep_tuple else parts), tensors
    return obj, tensors


def _key(path: tuple) -> str:
    for part in path:
        if "/" in str(part):
            raise ConfigurationError(
                f"Checkpoint key {part!r} contains '/', which sharded checkpoints use as their path separator. "
                "Rename the module attribute (or optimizer state entry)."
            )
    return "/".join(str(part) for part in path)


def _insert(skeleton: dict[str, Any], key: str, value: Tensor) -> None:
    """Put ``value`` back at ``key`` (a ``/``-joined path) in the skeleton, creating dicts where missing."""
    node: Any = skeleton
    parts = key.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            index = int(part)
            if last:
                node[index] = value
            else:
                node = node[index]
            continue
        name = next((k for k in node if str(k) == part), part)  # keys may be ints in the original
        if last:
            node[name] = value
        else:
            node = node.setdefault(name, {})


def _merge(a: Any, b: Any) -> Any:
    """Union of two skeletons: ranks that own different optimizer entries each contribute theirs."""
    if isinstance(a, dict) and isinstance(b, dict):
        merged = dict(a)
        for k, v in b.items():
            merged[k] = _merge(a[k], v) if k in a else v
        return merged
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [_merge(x, y) for x, y in zip(a, b)]
    return a


def flatten_tensors(nested: dict[str, Any]) -> dict[str, Tensor]:
    """The tensors of a nested checkpoint structure keyed as they are stored in a sharded folder."""
    return _split(nested)[1]


# ---------------------------------------------------------------------------------------------- safe reading
class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` while refusing every class that is not part of DCP's metadata."""

    _MODULES = {
        "torch.distributed.checkpoint.metadata": None,  # any class of the metadata module
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
        "collections": {"OrderedDict"},
    }

    def find_class(self, module: str, name: str) -> Any:
        allowed = self._MODULES.get(module, ())
        torch_value = module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype))
        if torch_value or (module in self._MODULES and (allowed is None or name in allowed)):
            return super().find_class(module, name)
        raise CheckpointError(
            f"Refusing to read the sharded checkpoint's metadata: it asks to import and call '{module}.{name}', "
            "which DCP metadata never contains. The folder may be hostile; do not load it."
        )


def _reader(path: Any) -> Any:
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeReader(sharded_storage.reader_base(str(path))):  # type: ignore[misc]
        """DCP's file reader with an allow-list unpickler for the metadata (DCP itself uses plain pickle)."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            with storage.open_read(storage.join(str(path), name)) as f:
                metadata = _MetadataUnpickler(f).load()
            if not isinstance(metadata, Metadata):
                raise CheckpointError(f"'{path}' has no valid DCP metadata.")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


# ---------------------------------------------------------------------------------------------- save / load
def save_sharded(strategy: Ranks, checkpoint: dict[str, Any], path: str | os.PathLike,
                 writer: Optional["BackgroundWriter"] = None) -> None:  # fmt: skip
    """Write ``checkpoint`` as a sharded folder at ``path``. Every rank calls; each writes the shards it holds.

    The tensors of :data:`SHARDED_SECTIONS` go through ``dcp.save`` (``dcp.async_save`` with a ``writer``); the
    rest is global rank 0's (every rank holds the same values there, except the RNG state, which is rank 0's as
    in a full checkpoint).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    target = os.fspath(path)
    sections = {k: checkpoint[k] for k in SHARDED_SECTIONS if k in checkpoint}
    skeleton, tensors = _split(sections)
    rest = {k: v for k, v in checkpoint.items() if k not in sections}
    distributed = dist.is_available() and dist.is_initialized()
    if writer is not None:
        writer.wait()  # at most one save in flight; it may still be writing into the previous temporary folder
    tmp = strategy.broadcast(sharded_storage.temporary_folder(target))
    if strategy.is_global_zero:
        sharded_storage.prepare_folder(target, tmp)
    if distributed:
        skeletons: Optional[list[Any]] = [None] * dist.get_world_size() if strategy.is_global_zero else None
        dist.gather_object(skeleton, skeletons, dst=0)  # small: everything but the tensors
        for other in (skeletons or [])[1:]:
            skeleton = _merge(skeleton, other)
    strategy.barrier("save_sharded")  # the folder exists before any rank writes into it
    info = {"format_version": FORMAT_VERSION, "world_size": strategy.world_size}
    meta = {**rest, "sharded_sections": skeleton, "sharded_checkpoint": info} if strategy.is_global_zero else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
        if writer is None:
            dcp.save(tensors, storage_writer=sharded_storage.dcp_writer(tmp), no_dist=not distributed)
        else:
            meta = writer.stager.stage(meta)  # e.g. a callback's tensors: the training goes on changing them
            future = dcp.async_save(tensors, storage_writer=sharded_storage.dcp_writer(tmp), no_dist=not distributed,
                                    process_group=writer.process_group(), async_stager=writer.dcp_stager())  # fmt: skip
    if writer is None:
        if meta is not None:
            sharded_storage.commit_folder(meta, tmp, target, META_FILE, info)
        return

    def finish() -> None:
        future.result()
        if meta is not None:
            writer.stager.wait_for_copies()
            sharded_storage.commit_folder(meta, tmp, target, META_FILE, info)

    writer.submit(finish, target)


def load_sharded(
    path: str | os.PathLike,
    templates: Optional[Callable[[dict[str, Any]], dict[str, Any]]] = None,
    keep_untemplated: Optional[Callable[[str], bool]] = None,
    distributed: bool = True,
) -> dict[str, Any]:
    """Read a sharded folder into a checkpoint dict. Every rank calls (collective unless ``distributed=False``).

    ``templates(sections)`` receives the saved sections without their tensors and returns a nested structure
    like them whose tensors (DTensors for sharded strategies) receive the data: each rank reads only what its
    templates cover. A stored tensor without a template is read whole, unless ``keep_untemplated(key)`` says
    otherwise (e.g. optimizer entries another rank owns).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = os.fspath(path) if storage.is_remote(path) else Path(path)
    if not is_sharded_checkpoint(path):
        raise CheckpointError(
            f"'{path}' is not a sharded checkpoint folder (it needs '.metadata' and '{META_FILE}'); it may be an "
            "interrupted copy."
        )
    distributed = distributed and dist.is_available() and dist.is_initialized()
    if not distributed or dist.get_rank() == 0:  # the "last" lookup checked it already on rank 0 (then cached)
        verify_once(path)
    meta = safe_load(storage.join(path, META_FILE))
    info = meta.pop("sharded_checkpoint", {})
    if info.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"'{path}' has sharded format {info['format_version']}; upgrade the trainer package.")
    skeleton = meta.pop("sharded_sections", {})
    reader = _reader(path)
    wanted = flatten_tensors(templates(skeleton)) if templates is not None else {}
    request: dict[str, Tensor] = {}
    for key, stored in reader.read_metadata().state_dict_metadata.items():
        if not isinstance(stored, TensorStorageMetadata):
            raise CheckpointError(
                f"'{path}' holds a pickled object under '{key}'; a trainer sharded checkpoint stores only tensors "
                "there, and unpickling it could run code. Refusing to load."
            )
        if key in wanted:
            request[key] = wanted[key]
        elif keep_untemplated is None or keep_untemplated(key):
            request[key] = torch.empty(stored.size, dtype=stored.properties.dtype)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(request, storage_reader=reader, no_dist=not distributed)
    except CheckpointError:
        raise
    except Exception as err:  # DCP reports shape mismatches and damage as assorted exceptions
        raise CheckpointError(f"Could not read sharded checkpoint '{path}': {type(err).__name__}: {err}") from err
    for key, tensor in request.items():
        _insert(skeleton, key, tensor)
    return {**meta, **skeleton}


def load_full(path: str | os.PathLike) -> dict[str, Any]:
    """Read a sharded folder whole in this process (no process group needed): a normal full checkpoint.

    Optimizer states are converted back to torch's index-keyed format, so the result loads into a plain
    optimizer with ``optimizer.load_state_dict``.
    """
    checkpoint = load_sharded(path, distributed=False)
    if "optimizer_states" in checkpoint:
        checkpoint["optimizer_states"] = [optimizer_state_by_index(s) for s in checkpoint["optimizer_states"]]
    return checkpoint


def consolidate(src: str | os.PathLike, dst: str | os.PathLike) -> dict[str, Any]:
    """Turn the sharded folder ``src`` into one full checkpoint file ``dst`` (loadable with
    ``torch.load(dst, weights_only=True)``); returns the checkpoint."""
    src, dst = os.fspath(src), os.fspath(dst)
    if not storage.exists(src):
        raise FileNotFoundError(f"Sharded checkpoint not found: '{src}'.")
    if not is_sharded_checkpoint(src):
        hint = " It is already a single-file checkpoint." if storage.isfile(src) else ""
        raise CheckpointError(f"'{src}' is not a sharded checkpoint folder (no '.metadata' and '{META_FILE}').{hint}")
    inside = dst.rstrip("/") == src.rstrip("/") or dst.startswith(src.rstrip("/") + "/")
    if not storage.is_remote(src) and not storage.is_remote(dst):
        inside = Path(dst).resolve() == Path(src).resolve() or Path(src).resolve() in Path(dst).resolve().parents
    if inside:
        raise ConfigurationError(f"The output '{dst}' must lie outside the sharded folder '{src}'.")
    checkpoint = load_full(src)
    atomic_save(checkpoint, dst)
    return checkpoint


# ---------------------------------------------------------------------------------------------- strategies
class ShardedCheckpointIO:
    """Mixin for strategies whose checkpoints are sharded folders (``state_dict_type="sharded"``) or one file
    gathered on global rank 0 (``"full"``). Any of them loads either kind.

    The strategy provides ``checkpoint_templates(sections)`` (where each rank's shards load to) and may
    override ``keep_untemplated(key)``.
    """

    state_dict_type: str = "sharded"
    restore_checkpoint_after_setup: bool = True  # a folder's optimizer shards load into the optimizers' templates

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
        """A folder written by every rank, or (``"full"``) one file written by global rank 0."""
        if self.state_dict_type == "sharded":
            save_sharded(self, checkpoint, path)  # type: ignore[arg-type]
            return
        _gather_accumulated_grads(checkpoint)
        super().save_checkpoint(checkpoint, path)  # type: ignore[misc]

    def save_checkpoint_async(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                              writer: "BackgroundWriter") -> None:  # fmt: skip
        """As :meth:`save_checkpoint`, written in ``writer``'s thread (``dcp.async_save`` for folders)."""
        if self.state_dict_type == "sharded":
            save_sharded(self, checkpoint, path, writer)  # type: ignore[arg-type]
            return
        _gather_accumulated_grads(checkpoint)
        if self.is_global_zero:  # type: ignore[attr-defined]
            writer.save_file(checkpoint, path)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """A sharded folder (each rank reads its shards, in any world size) or a full file."""
        if is_sharded_checkpoint(path):
            return load_sharded(path, self.checkpoint_templates, self.keep_untemplated)
        return super().load_checkpoint(path)  # type: ignore[misc]

    def checkpoint_templates(self, sections: dict[str, Any]) -> dict[str, Any]:
        """Tensors, shaped like the saved sections, that this rank's shards load into."""
        raise NotImplementedError

    def keep_untemplated(self, key: str) -> bool:
        """Whether to read a stored tensor that has no template whole (default: yes)."""
        return True


def _gather_accumulated_grads(checkpoint: dict[str, Any]) -> None:
    grads = checkpoint.get("accumulated_grads")
    if grads and any(is_dtensor(g) for g in grads["grads"].values()):  # gathered on every rank (collective)
        grads["grads"] = {k: g.full_tensor() if is_dtensor(g) else g for k, g in grads["grads"].items()}


def parameter_names(module: nn.Module, optimizer: Optimizer) -> list[str]:
    """The name in ``module`` of each of ``optimizer``'s parameters, in the optimizer's (index) order."""
    names = {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}
    missing = [i for i, p in enumerate(optimizer_parameters(optimizer)) if id(p) not in names]
    if missing:
        raise ConfigurationError(
            f"{type(optimizer).__name__} holds {len(missing)} parameter(s) that are not the module's, so its state "
            "cannot be saved by parameter name. Give the optimizer only self.parameters()."
        )
    return [names[id(p)] for p in optimizer_parameters(optimizer)]


def optimizer_parameters(optimizer: Optimizer) -> list[Tensor]:
    """Every parameter of ``optimizer``, in its index order (groups in order)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


# ---------------------------------------------------------------------------------------------- optimizer format
def keyed_by_name(state: dict[str, Any]) -> bool:
    """True for an optimizer state dict keyed by parameter name (DCP's format) rather than by index."""
    return any(isinstance(p, str) for group in state.get("param_groups", []) for p in group.get("params", []))


def optimizer_state_by_index(state: dict[str, Any], names: Optional[list[str]] = None) -> dict[str, Any]:
    """A name-keyed optimizer state dict in torch's index-keyed format: ``names[i]`` is parameter ``i`` of the
    optimizer it is for (default: the saved groups' order, parameters numbered across groups)."""
    if not keyed_by_name(state):
        return state
    names = names or [name for group in state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    unknown = [name for group in state["param_groups"] for name in group["params"] if name not in index]
    if unknown:
        raise CheckpointError(f"The checkpoint's optimizer state holds parameters this model lacks: {unknown[:5]}.")
    entries = sorted((index[name], value) for name, value in state.get("state", {}).items())
    return {
        "state": dict(entries),
        "param_groups": [{**group, "params": [index[n] for n in group["params"]]} for group in state["param_groups"]],
    }


def optimizer_state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An index-keyed optimizer state dict keyed by parameter name; ``names[i]`` names parameter ``i``."""
    if keyed_by_name(state):
        return state
    groups = state.get("param_groups", [])
    count = sum(len(group["params"]) for group in groups)
    if count != len(names):
        raise CheckpointError(
            f"The checkpoint's optimizer state covers {count} parameters but the optimizer has {len(names)}; "
            "was it saved for a different model or optimizer set-up?"
        )
    return {
        "state": {names[i]: value for i, value in state.get("state", {}).items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in groups],
    }
