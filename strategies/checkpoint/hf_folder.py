"""Hugging Face folders (``config.json``, ``model-0000i-of-0000N.safetensors``, ``model.safetensors.index.json``)
written and read at any layout, without gathering the model on a rank.

Saving (:func:`save_hf_folder`, every rank calls): each rank writes only the parts of the tensors it holds (DCP's
``HuggingFaceStorageWriter`` with ``save_distributed=True``: a ``DTensor``'s local shard, a replicated tensor by one
rank), into a staging folder; then the ranks share the output files (file ``i`` is rank ``i % world``'s) and each
assembles its files tensor by tensor from the staged parts (``consolidate_safetensors_files_on_every_rank``). A
rank's extra memory is its staged write buffer and one tensor of one output file, never the model.

Loading (:func:`load_hf_folder`): DCP's ``HuggingFaceStorageReader`` reads into each rank's tensors only what they
hold. Called while the model is still on ``meta`` (in ``configure_model`` under a sharded strategy), the load waits
for the strategy to give the shards memory (:func:`~trainer.strategies.speed.deferred_init.materialize` runs it).

Exporting a checkpoint (:func:`export_checkpoint`, one process): a trainer checkpoint (a file, or a sharded folder
of any layout) becomes a Hugging Face folder one output file at a time: only that file's tensors are read.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn

from trainer.strategies.checkpoint import storage
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.hf_models import hf_models

INDEX_FILE = "model.safetensors.index.json"
_STAGING = ".sharded-parts"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}  # fmt: skip
AFTER_MATERIALIZE = "_after_materialize"  # a module's list of callables materialize() runs once it has memory


_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "16": torch.float16, "fp32": torch.float32, "float32": torch.float32, "32": torch.float32}  # fmt: skip


def parse_dtype(value: Union[None, str, torch.dtype]) -> Optional[torch.dtype]:
    """``None`` (as trained), a ``torch.dtype``, or a name: ``"bf16"``/``"bfloat16"``, ``"fp16"``, ``"fp32"`` (also
    a precision name such as ``"bf16-true"``)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    found = _DTYPES.get(str(value).lower().replace("-true", "").replace("-mixed", ""))
    if found is None:
        raise ConfigurationError(f"dtype={value!r} is not understood. Use 'bf16', 'fp16', 'fp32' or a torch.dtype.")
    return found


def parse_size(size: Union[int, str]) -> int:
    """Bytes of ``size``: an int, or a string as ``transformers`` takes ``max_shard_size`` (``"5GB"``, ``"200MB"``,
    ``"64KiB"``)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(size))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigurationError(
            f"max_shard_size={size!r} is not a size. Give bytes (an int) or a string such as '5GB', '500MB', '64KiB'."
        )
    return int(float(match.group(1)) * _UNITS[unit])


def the_hf_model(module: nn.Module, action: str) -> tuple[str, nn.Module]:
    """The one outermost Hugging Face model in ``module`` (itself, or a submodule such as a TrainModule's
    ``self.model``) with its name; raises saying what to pass when there is none, or several."""
    found = hf_models(module)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConfigurationError(
            f"{action} needs a Hugging Face transformers model (a PreTrainedModel, e.g. AutoModelForCausalLM."
            f"from_config(config)), and {type(module).__name__} holds none. Pass the module holding it as an "
            "attribute (self.model = AutoModelForCausalLM...), or the model itself."
        )
    names = [name or "<the module itself>" for name, _ in found]
    raise ConfigurationError(
        f"{action} found {len(found)} Hugging Face models in {type(module).__name__} ({names}); pass the one you "
        f"mean, e.g. {action}(module.{names[0]}, directory)."
    )


def _tied_targets(model: nn.Module) -> set[str]:
    """The names ``transformers`` leaves out of a saved file because they are tied to another (the output head)."""
    keys = getattr(model, "_tied_weights_keys", None) or ()
    return set(keys.keys() if isinstance(keys, dict) else keys)


def hf_state_dict(model: nn.Module, dtype: Optional[torch.dtype] = None) -> dict[str, Tensor]:
    """The model's tensors as ``transformers`` saves them: by the model's own names, each tied tensor once (under
    the name that is not a tied target), floating ones in ``dtype`` if given. Sharded tensors stay sharded."""
    targets = _tied_targets(model)
    first: dict[int, str] = {}
    kept: dict[str, Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        owner = first.get(id(tensor))
        if owner is not None:
            if owner in targets and name not in targets:  # keep the source (the embedding), as transformers does
                del kept[owner]
                first[id(tensor)] = name
            else:
                continue
        first.setdefault(id(tensor), name)
        value = tensor.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        kept[name] = value
    return kept


def shard_plan(sizes: list[tuple[str, int]], max_bytes: int) -> dict[str, int]:
    """``{name: file index from 1}``: tensors in order, a new file when the next would pass ``max_bytes`` (a tensor
    larger than that gets a file of its own, as in ``transformers``)."""
    plan: dict[str, int] = {}
    index, used = 1, 0
    for name, size in sizes:
        if used and used + size > max_bytes:
            index, used = index + 1, 0
        plan[name] = index
        used += size
    return plan


def _file_name(index: int, count: int) -> str:
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def _nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _local_dir(directory: Union[str, os.PathLike], action: str) -> Path:
    if storage.is_remote(directory):
        raise ConfigurationError(
            f"{action} writes and reads a local folder, and {directory!r} is a URL. Use a local (or mounted shared) "
            "folder, then copy it (e.g. huggingface_hub.upload_folder or fsspec's put)."
        )
    return Path(directory)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def write_config(model_or_config: Any, directory: Path, dtype: Optional[torch.dtype]) -> None:
    """``config.json`` (its dtype the saved one), and ``generation_config.json`` when the model can generate."""
    config = copy.deepcopy(getattr(model_or_config, "config", model_or_config))  # the live model's stays as it is
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(directory)
    generation = getattr(model_or_config, "generation_config", None)
    if generation is not None and callable(getattr(model_or_config, "can_generate", None)) and model_or_config.can_generate():
        generation.save_pretrained(directory)


def save_hf_folder(module: nn.Module, directory: Union[str, os.PathLike], max_shard_size: Union[int, str] = "5GB",
                   dtype: Optional[torch.dtype] = None) -> Path:  # fmt: skip
    """Write the Hugging Face model inside ``module`` as a folder ``from_pretrained`` loads. Every rank calls;
    each writes only what it holds. Returns the folder."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
        consolidate_safetensors_files_on_every_rank,
    )

    _, model = the_hf_model(module, "save_pretrained")
    target = _local_dir(directory, "save_pretrained")
    limit = parse_size(max_shard_size)
    state = hf_state_dict(model, dtype)
    if any(value.is_meta or (hasattr(value, "to_local") and value.to_local().is_meta) for value in state.values()):
        raise ConfigurationError(
            "save_pretrained was given a model still on the meta device (no weights yet). Call it after the strategy "
            "set the model up: after fit, or from a hook such as on_train_end."
        )
    sizes = [(name, value.numel() * value.element_size()) for name, value in state.items()]
    distributed = _distributed()
    rank = dist.get_rank() if distributed else 0
    if distributed:  # under pipeline parallel each rank holds some names: the plan is over every rank's
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sizes)
        sizes = list(dict(item for ranks in everyone for item in ranks).items())
    plan = shard_plan(sizes, limit)
    staging = target / _STAGING
    if rank == 0:
        if staging.exists():
            shutil.rmtree(staging)
        for stale in target.glob("model-*-of-*.safetensors") if target.exists() else ():
            stale.unlink()  # a previous export with another file count
        staging.mkdir(parents=True)
    if distributed:
        dist.barrier()
    writer = HuggingFaceStorageWriter(str(staging), fqn_to_index_mapping=plan, save_distributed=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
        dcp.save(state, storage_writer=writer, no_dist=not distributed)
    del state
    if distributed:
        consolidate_safetensors_files_on_every_rank(str(staging), str(target), plan)  # (a barrier at its end)
    else:  # (the function above says it runs in one process, as a warning)
        consolidate_safetensors_files(str(staging), str(target), plan)
    if rank == 0:
        shutil.rmtree(staging)
        count = max(plan.values(), default=1)  # the index (torch writes it only in a process group)
        index = {"metadata": {"total_size": sum(size for _, size in sizes)},
                 "weight_map": {name: _file_name(i, count) for name, i in plan.items()}}  # fmt: skip
        (target / INDEX_FILE).write_text(json.dumps(index, indent=2))
        saved = dtype or next((v.dtype for v in model.parameters() if v.is_floating_point()), None)
        write_config(model, target, saved)
    if distributed:
        dist.barrier()
    return target


def load_hf_folder(module: nn.Module, directory: Union[str, os.PathLike]) -> None:
    """Load a Hugging Face folder into the model inside ``module``, at whatever layout it has: each rank reads the
    parts its tensors hold. On a model still on ``meta``, the load runs when the strategy materialises it."""
    _, model = the_hf_model(module, "load_pretrained")
    source = _local_dir(directory, "load_pretrained")
    if not (source / INDEX_FILE).is_file() and not any(source.glob("*.safetensors")):
        raise ConfigurationError(
            f"load_pretrained: {str(source)!r} holds no safetensors weights (model*.safetensors and "
            f"{INDEX_FILE}). Give a folder written by save_pretrained (ours or transformers')."
        )
    if any(_local_of(t).is_meta for t in model.state_dict(keep_vars=True).values()):
        hooks: list[Callable[[], None]] = model.__dict__.setdefault(AFTER_MATERIALIZE, [])
        hooks.append(lambda: _load(model, source))
        return
    _load(model, source)


def _local_of(tensor: Tensor) -> Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _load(model: nn.Module, source: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    state = hf_state_dict(model)
    reader = HuggingFaceStorageReader(str(source))
    stored = reader.read_metadata().state_dict_metadata
    missing = sorted(set(state) - set(stored))
    if missing:
        raise ConfigurationError(
            f"load_pretrained: {str(source)!r} has no weights for {missing[:5]}{' ...' if len(missing) > 5 else ''} "
            f"of {type(model).__name__}. Is it a folder of this architecture and configuration?"
        )
    for name, value in state.items():
        if tuple(stored[name].size) != tuple(value.shape):
            raise ConfigurationError(
                f"load_pretrained: {name} is {tuple(stored[name].size)} in {str(source)!r} but "
                f"{tuple(value.shape)} in the model; build the model from that folder's config.json."
            )
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(state, storage_reader=reader, no_dist=not _distributed())


# ---------------------------------------------------------------------------------------------- export
def export_checkpoint(checkpoint: Union[str, os.PathLike], directory: Union[str, os.PathLike], config: Any,
                      max_shard_size: Union[int, str] = "5GB", dtype: Optional[torch.dtype] = None,
                      prefix: Optional[str] = None) -> dict[str, Any]:  # fmt: skip
    """Write the model weights of a trainer checkpoint (a file, or a sharded folder of any layout) as a Hugging
    Face folder for ``config`` (a ``PretrainedConfig``), one output file at a time: never the whole model in
    memory. ``prefix`` is the model's name in the checkpoint's ``state_dict`` (found when not given). Returns a
    summary (files, tensors, bytes)."""
    from transformers import AutoModelForCausalLM

    from trainer.strategies.checkpoint.sharded_checkpoint import is_sharded_checkpoint

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = hf_state_dict(model)
    source = os.fspath(checkpoint)
    read, stored = (_folder_reader if is_sharded_checkpoint(source) else _file_reader)(source)
    prefix = _find_prefix(list(shapes), list(stored), prefix, source)
    for name, meta in shapes.items():
        if prefix + name not in stored:
            raise ConfigurationError(f"The checkpoint '{source}' has no '{prefix + name}' for {type(model).__name__}.")
        if tuple(stored[prefix + name][0]) != tuple(meta.shape):
            raise ConfigurationError(
                f"'{prefix + name}' is {tuple(stored[prefix + name][0])} in '{source}' but {tuple(meta.shape)} in a "
                f"{type(model).__name__} of the given config; give the config the checkpoint was trained with."
            )
    out_dtype = {name: dtype or stored[prefix + name][1] for name in shapes}
    sizes = [(name, shapes[name].numel() * torch.empty((), dtype=out_dtype[name]).element_size()) for name in shapes]
    plan = shard_plan(sizes, parse_size(max_shard_size))
    count = max(plan.values(), default=1)
    target = _local_dir(directory, "export")
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.glob("model-*-of-*.safetensors"):
        stale.unlink()
    from safetensors.torch import save_file

    weight_map, total = {}, 0
    for index in range(1, count + 1):
        names = [name for name, i in plan.items() if i == index]
        tensors = read([prefix + name for name in names])
        part = {name: tensors[prefix + name].to(out_dtype[name]).contiguous() for name in names}
        save_file(part, str(target / _file_name(index, count)), metadata={"format": "pt"})
        weight_map.update({name: _file_name(index, count) for name in names})
        total += sum(_nbytes(t) for t in part.values())
        del tensors, part
    (target / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    saved = dtype or next(iter(out_dtype.values()), None)
    write_config(model, target, saved)
    return {"files": count, "tensors": len(weight_map), "bytes": total, "prefix": prefix}


def _find_prefix(names: list[str], stored: list[str], prefix: Optional[str], source: str) -> str:
    if prefix is not None:
        return prefix if not prefix or prefix.endswith(".") else prefix + "."
    probe = names[0] if names else ""
    candidates = [key[: len(key) - len(probe)] for key in stored if key.endswith(probe)]
    for candidate in sorted(candidates, key=len):
        if (not candidate or candidate.endswith(".")) and all(candidate + n in stored for n in names):
            return candidate
    raise ConfigurationError(
        f"The checkpoint '{source}' holds no model of the given config (no set of keys ending in its weight names, "
        f"such as '{probe}'). Give the config the checkpoint was trained with (--config), or the model's name in "
        "the checkpoint (--prefix model.)."
    )


def _file_reader(path: str) -> tuple[Callable[[list[str]], dict[str, Tensor]], dict[str, tuple]]:
    """A single-file checkpoint, memory-mapped: reading some tensors touches only their pages."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    weights = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(weights, dict):
        raise ConfigurationError(f"'{path}' is not a trainer checkpoint (no 'state_dict').")
    stored = {k: (tuple(v.shape), v.dtype) for k, v in weights.items() if isinstance(v, Tensor)}
    return (lambda keys: {k: weights[k] for k in keys}), stored


def _folder_reader(path: str) -> tuple[Callable[[list[str]], dict[str, Tensor]], dict[str, tuple]]:
    """A sharded folder (any layout): each call reads only the requested tensors, assembled from their shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from trainer.strategies.checkpoint.sharded_checkpoint import _reader

    reader = _reader(path)
    section = "state_dict/"
    stored = {key[len(section):]: (tuple(meta.size), meta.properties.dtype)
              for key, meta in reader.read_metadata().state_dict_metadata.items()
              if key.startswith(section) and isinstance(meta, TensorStorageMetadata)}  # fmt: skip

    def read(keys: list[str]) -> dict[str, Tensor]:
        request = {section + k: torch.empty(stored[k][0], dtype=stored[k][1]) for k in keys}
        dcp.load(request, storage_reader=_reader(path), no_dist=True)
        return {k[len(section):]: v for k, v in request.items()}

    return read, stored
