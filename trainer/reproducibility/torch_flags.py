"""The process-wide torch settings a Trainer asks for (``deterministic``, ``benchmark``), held for the duration of
one stage (fit, validate, test, predict) and put back afterwards, so a later Trainer or the rest of the script
does not inherit them. (The default dtype that ``precision="64-true"`` sets is already scoped: it is set only
inside each step and ``init_module``.)"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch

_CUBLAS = "CUBLAS_WORKSPACE_CONFIG"


def apply(deterministic: Any, benchmark: Optional[bool]) -> Optional[tuple[Any, ...]]:
    """Set the flags a stage runs with; returns what to hand :func:`restore` (``None``: nothing was changed)."""
    if not deterministic and benchmark is None:
        return None
    cudnn = torch.backends.cudnn
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.deterministic, cudnn.benchmark, os.environ.get(_CUBLAS))  # fmt: skip
    if deterministic:
        os.environ.setdefault(_CUBLAS, ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=deterministic == "warn")
        cudnn.deterministic = True
        cudnn.benchmark = False
    if benchmark is not None:
        cudnn.benchmark = benchmark
    return saved


def restore(saved: Optional[tuple[Any, ...]]) -> None:
    """Put back what :func:`apply` found."""
    if saved is None:
        return
    enabled, warn_only, cudnn_deterministic, cudnn_benchmark, cublas = saved
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.backends.cudnn.deterministic = cudnn_deterministic
    torch.backends.cudnn.benchmark = cudnn_benchmark
    if cublas is None:
        os.environ.pop(_CUBLAS, None)
    else:
        os.environ[_CUBLAS] = cublas
