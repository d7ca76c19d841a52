"""``accelerator.load_state(folder)`` of a folder Hugging Face Accelerate's ``save_state`` wrote, so a job started
on Accelerate continues here after the import change.

Accelerate's layout, for the objects prepared in order (``_i`` from the second one on)::

    model.safetensors / model_1.safetensors      or pytorch_model.bin / pytorch_model_1.bin (safe_serialization=False)
    optimizer.bin / optimizer_1.bin               torch.save of optimizer.state_dict()
    scheduler.bin / scheduler_1.bin               torch.save of scheduler.state_dict()
    scaler.pt                                     the fp16 GradScaler's state dict
    custom_checkpoint_0.pkl, ...                  register_for_checkpointing objects' state dicts
    random_states_<rank>.pkl                      Python's, NumPy's and torch's RNG states
    sampler.bin, dl_state_dict.bin                the dataloaders' positions

Every file is read with ``torch.load(weights_only=True)`` (safetensors through ``safetensors``); the RNG files
only allow NumPy's array and dtype types besides, so nothing in them can run code. A file that needs more is
refused with the reason. The dataloaders' positions are not read: as on Accelerate, continue mid-epoch with
``accelerator.skip_first_batches(loader, n)``.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.strategies.checkpoint.checkpoint_io import safe_load
from trainer.strategies.errors import CheckpointError, ConfigurationError
from trainer.strategies.rank import rank_zero_warn


def is_accelerate_folder(folder: Path) -> bool:
    """True for a folder Accelerate's ``save_state`` wrote (and not our own ``save_state``)."""
    if not folder.is_dir() or (folder / "engine_state.pt").exists():
        return False
    return any((folder / name).exists() for name in ("model.safetensors", "pytorch_model.bin", "optimizer.bin")) or any(
        folder.glob("random_states_*.pkl")
    )


def _numbered(folder: Path, stem: str, index: int, suffix: str) -> Path:
    return folder / (f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}")


def _model_file(folder: Path, index: int) -> Optional[Path]:
    for stem, suffix in (("model", ".safetensors"), ("pytorch_model", ".bin")):
        path = _numbered(folder, stem, index, suffix)
        if path.exists():
            return path
    return None


def _read_model(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ConfigurationError(f"'{path}' is a safetensors file: install the safetensors package to read "
                                     "it.") from None  # fmt: skip
        return load_file(str(path))
    return safe_load(path)


def _count(folder: Path, stem: str, suffix: str) -> int:
    count = 0
    while _numbered(folder, stem, count, suffix).exists():
        count += 1
    return count


def load_accelerate_folder(accelerator: Any, folder: Path) -> None:
    """Restore Accelerate's ``save_state`` folder into the objects ``accelerator`` prepared (in the same order)."""
    strategy = accelerator.strategy
    modules = [module for module, _, _ in accelerator._modules]
    models = 0
    while _model_file(folder, models) is not None:
        models += 1
    found = {"models": (models, len(modules)),
             "optimizers": (_count(folder, "optimizer", ".bin"), len(accelerator._optimizers)),
             "schedulers": (_count(folder, "scheduler", ".bin"), len(accelerator._schedulers))}  # fmt: skip
    wrong = [f"{saved} {kind} saved, {now} prepared" for kind, (saved, now) in found.items() if saved != now]
    if wrong:
        raise CheckpointError(f"'{folder}' (written by Accelerate's save_state) does not match this Accelerator: "
                              f"{'; '.join(wrong)}. Prepare the same objects, in the same order, before load_state().")  # fmt: skip
    for index, module in enumerate(modules):
        strategy.load_module_state_dict(_read_model(_model_file(folder, index)), module=module)
    for index, optimizer in enumerate(accelerator._optimizers):
        strategy.load_optimizer_state_dict(optimizer.optimizer, safe_load(_numbered(folder, "optimizer", index, ".bin")))
    for index, scheduler in enumerate(accelerator._schedulers):
        scheduler.load_state_dict(safe_load(_numbered(folder, "scheduler", index, ".bin")))
    if (folder / "scaler.pt").exists():
        strategy.precision.load_state_dict({"scaler": safe_load(folder / "scaler.pt")})
    for index, obj in enumerate(accelerator._custom):
        obj.load_state_dict(safe_load(folder / f"custom_checkpoint_{index}.pkl"))
    _restore_random_states(folder / f"random_states_{strategy.global_rank}.pkl")
    positions = [name for name in ("sampler.bin", "dl_state_dict.bin") if (folder / name).exists()]
    if positions:
        rank_zero_warn(f"load_state('{folder}'): the dataloader positions Accelerate saved ({', '.join(positions)}) "
                       "are not read; the next pass starts at the epoch's first batch. Continue mid-epoch with "
                       "accelerator.skip_first_batches(loader, n), as on Accelerate.")  # fmt: skip
    strategy.barrier("load_state")


def _restore_random_states(path: Path) -> None:
    if not path.exists():
        rank_zero_warn(f"load_state: '{path}' is missing; the random streams continue from the current seed.")
        return
    try:
        states = _load_with_numpy(path)
    except Exception as err:  # refused by the restricted unpickler, or damaged
        rank_zero_warn(f"load_state: '{path}' is not read ({type(err).__name__}: {err}). It is a pickle, which is "
                       "only read with torch.load(weights_only=True) (NumPy arrays allowed), as unpickling anything "
                       "else could run code; the random streams continue from the current seed.")  # fmt: skip
        return
    if "random_state" in states:
        random.setstate(_as_random_state(states["random_state"]))
    if "numpy_random_seed" in states:
        import numpy as np

        np.random.set_state(states["numpy_random_seed"])
    if "torch_manual_seed" in states:
        torch.set_rng_state(states["torch_manual_seed"])
    if "torch_cuda_manual_seed" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])


def _as_random_state(state: Any) -> tuple:
    """``random.getstate()``'s nested tuple (a list after some round trips)."""
    version, internal, gauss = state
    return version, tuple(internal), gauss


def _load_with_numpy(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` allowing NumPy's RNG state (an array of uint32 and its dtype)."""
    allowed: list[Any] = []
    try:
        import numpy as np

        core = getattr(np, "_core", None) or np.core
        allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    except ImportError:
        pass
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)
