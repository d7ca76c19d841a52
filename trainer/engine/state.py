"""``Engine.save_state``/``load_state``: a folder from which a hand-written loop resumes exactly.

    DIR/engine_state.pt   written by global rank 0 (through the strategy): the prepared modules, optimizers and
                          LR schedulers, the precision plugin's state (gradient scaler), the accumulation
                          window's position and the registered objects
    DIR/rank_<r>.pt       one per rank: every global RNG, each prepared training dataloader's position (see
                          :mod:`trainer.checkpoint.data_position`) and, when saved inside an accumulation window, that
                          window's gradients (not all-reduced yet, so they differ per rank)

Both are plain dicts of tensors and Python values, written atomically and read with ``weights_only=True``.
On resume the next pass over a prepared training dataloader redraws the saved epoch's order, skips the
finished batches without loading them, and then puts the saved RNG back, as the Trainer's resume does.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, atomic_save, safe_load
from trainer.strategies.rank import rank_zero_warn
from trainer.module.saving import check_state_dict
from trainer.reproducibility.seed import capture_rng_state, restore_rng_state

if TYPE_CHECKING:  # pragma: no cover
    from trainer.strategies.strategy import Strategy

FORMAT_VERSION = 1
SHARED_FILE = "engine_state.pt"


class EngineParts(Protocol):
    """What saving and loading a state need of the :class:`trainer.engine.engine.Engine` (which imports this module,
    so it is described here rather than imported): its strategy and what it prepared, in order."""

    strategy: "Strategy"
    _modules: list[Any]  # (module, runner, autocast hooks)
    _optimizers: list[Any]
    _schedulers: list[Any]
    _loaders: list[Any]
    _custom: list[Any]  # register_for_checkpointing
    _window: Any  # trainer.engine.wrappers.AccumulationWindow


def rank_file(folder: Path, rank: int) -> Path:
    """The file holding ``rank``'s own state."""
    return folder / f"rank_{rank}.pt"


def save_engine_state(engine: EngineParts, folder: Path) -> Path:
    """Write ``folder`` (see the module docstring); every rank must call it. Returns ``folder``."""
    strategy = engine.strategy
    window = engine._window
    shared = {
        "format_version": FORMAT_VERSION,
        "world_size": strategy.world_size,
        "modules": [strategy.module_state_dict(module) for module, _, _ in engine._modules],
        "optimizers": [strategy.optimizer_state_dict(optimizer.optimizer) for optimizer in engine._optimizers],
        "schedulers": [scheduler.state_dict() for scheduler in engine._schedulers],
        "precision": strategy.precision.state_dict(),
        "window_position": window.position,
        "custom": [obj.state_dict() for obj in engine._custom],
    }
    strategy.save_checkpoint(shared, folder / SHARED_FILE)
    own: dict[str, Any] = {
        "rng": capture_rng_state(),
        "loaders": [loader.state_dict() for loader in engine._loaders if loader.training],
    }
    if window.position:  # saved inside a window: its gradients so far are part of the state
        own["grads"] = [{name: param.grad.detach().clone() for name, param in module.named_parameters()
                         if param.grad is not None} for module, _, _ in engine._modules]  # fmt: skip
    atomic_save(own, rank_file(folder, strategy.global_rank))
    strategy.barrier("save_state")
    return folder


def load_engine_state(engine: EngineParts, folder: Path) -> None:
    """Restore ``folder`` into the objects ``engine`` prepared (in the same order as when it was saved)."""
    strategy = engine.strategy
    path = folder / SHARED_FILE
    if not path.exists() and any((folder / name).exists() for name in ("model.safetensors", "pytorch_model.bin")):
        raise CheckpointError(f"'{folder}' was written by Hugging Face Accelerate's save_state (it has no "
                              f"{SHARED_FILE}). Load it with trainer.accelerate.Accelerator(...).load_state(folder), "
                              "which reads Accelerate's layout.")  # fmt: skip
    shared = strategy.load_checkpoint(path)
    if not isinstance(shared, dict) or shared.get("format_version", 0) > FORMAT_VERSION or "modules" not in shared:
        raise CheckpointError(f"'{path}' is not an Engine state this version can read (written by save_state?).")
    _check_counts(shared, engine, path)
    for (module, _, _), state in zip(engine._modules, shared["modules"]):
        if set(module.state_dict()) != set(state):
            check_state_dict(module, state, path)  # raises naming the missing/unexpected keys
        strategy.load_module_state_dict(state, module=module)
    for optimizer, state in zip(engine._optimizers, shared["optimizers"]):
        strategy.load_optimizer_state_dict(optimizer.optimizer, state)
    for scheduler, state in zip(engine._schedulers, shared["schedulers"]):
        scheduler.load_state_dict(state)
    strategy.precision.load_state_dict(shared["precision"])
    engine._window.position = shared["window_position"]
    engine._window.sync = shared["window_position"] == 0
    for obj, state in zip(engine._custom, shared["custom"]):
        obj.load_state_dict(state)

    same_world = shared["world_size"] == strategy.world_size
    own = _own_state(folder, strategy.global_rank, same_world, shared["world_size"], strategy.world_size)
    if own is None:
        return
    restore_rng_state(own["rng"])
    training_loaders = [loader for loader in engine._loaders if loader.training]
    for loader, state in zip(training_loaders, own["loaders"]):
        loader.load_state_dict(state, own["rng"])
    if own.get("grads") and same_world:
        for (module, _, _), grads in zip(engine._modules, own["grads"]):
            for name, param in module.named_parameters():
                if name in grads:
                    param.grad = grads[name].to(param.device, param.dtype)


def _check_counts(shared: dict[str, Any], engine: EngineParts, path: Path) -> None:
    found = {"modules": len(engine._modules), "optimizers": len(engine._optimizers),
             "schedulers": len(engine._schedulers), "custom": len(engine._custom)}  # fmt: skip
    wrong = [f"{len(shared[key])} {key} saved, {count} now" for key, count in found.items() if len(shared[key]) != count]
    if wrong:
        raise CheckpointError(
            f"'{path}' does not match this Engine: {'; '.join(wrong)} ('custom' = register_for_checkpointing). "
            "Prepare and register the same objects, in the same order, before load_state()."
        )


def _own_state(folder: Path, rank: int, same_world: bool, saved_world: int, world: int) -> Optional[dict[str, Any]]:
    path = rank_file(folder, rank)
    if not same_world:
        rank_zero_warn(
            f"'{folder}' was saved by {saved_world} process(es), now {world}: the gradients of an unfinished "
            "accumulation window are dropped and the data split changes, so the resume is not exact."
        )
        if not path.exists():
            return None
    return safe_load(path, map_location="cpu")
