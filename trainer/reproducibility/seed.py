"""Seeding and random-number-generator state (captured in checkpoints for exact resume)."""
from __future__ import annotations

import contextlib
import os
import random
from typing import Any, Iterator, Optional

import torch

from trainer.strategies.rank import rank_zero_info

_MAX_SEED = 2**32 - 1


def seed_everything(seed: Optional[int] = None, workers: bool = False) -> int:
    """Seed Python's ``random``, NumPy (if installed) and torch (CPU and CUDA); returns the seed.

    With ``seed=None`` the ``PL_GLOBAL_SEED``/``TRAINER_SEED`` environment variable is used, else 0. The seed is
    exported as ``TRAINER_SEED`` so processes started by the launcher use the same one. ``workers=True``
    also makes DataLoader workers derive distinct, reproducible seeds.
    """
    if seed is None:
        env = os.environ.get("TRAINER_SEED") or os.environ.get("PL_GLOBAL_SEED")
        seed = int(env) if env is not None else 0
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed={seed!r} must be an int in [0, {_MAX_SEED}].")
    os.environ["TRAINER_SEED"] = str(seed)
    os.environ["TRAINER_SEED_WORKERS"] = "1" if workers else "0"
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass
    torch.manual_seed(seed)  # seeds CUDA too
    rank_zero_info("Seed set to %d", seed)
    return seed


def capture_rng_state(cuda: bool = True) -> dict[str, Any]:
    """Every global RNG state as tensors and plain values (safe for ``weights_only`` checkpoints).

    ``cuda=False`` leaves out the CUDA generators (for states that only host-side code such as a sampler uses).
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": _python_state_to_plain(random.getstate())}
    if cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}  # fmt: skip
    except ImportError:  # pragma: no cover
        pass
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np_state = state["numpy"]
        np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype("uint32"), np_state["pos"],
                             np_state["has_gauss"], np_state["cached_gaussian"]))  # fmt: skip


def _python_state_to_plain(state: tuple) -> tuple:
    version, internal, gauss = state
    return (version, list(internal), gauss)


@contextlib.contextmanager
def isolated_rng() -> Iterator[None]:
    """Run a block without changing the global RNG streams (e.g. the sanity-check validation)."""
    state = capture_rng_state()
    try:
        yield
    finally:
        restore_rng_state(state)
