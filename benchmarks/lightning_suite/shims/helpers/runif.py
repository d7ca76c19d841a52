"""``RunIf``: skip a test whose hardware or optional packages are not here (Lightning's test marker, re-made)."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import pytest
import torch
from packaging.version import Version


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _torch_version() -> Version:
    return Version(torch.__version__.split("+")[0])


def _reasons(
    min_cuda_gpus: int = 0,
    min_torch: str | None = None,
    max_torch: str | None = None,
    min_python: str | None = None,
    bf16_cuda: bool = False,
    tpu: bool = False,
    mps: bool | None = None,
    skip_windows: bool = False,
    standalone: bool = False,
    deepspeed: bool = False,
    dynamo: bool = False,
    rich: bool = False,
    omegaconf: bool = False,
    psutil: bool = False,
    sklearn: bool = False,
    onnx: bool = False,
    linux_only: bool = False,
    onnxscript: bool = False,
    tensorrt: bool = False,
) -> list[str]:
    """Why the test cannot run here (empty: it runs). Each keyword is a requirement, as in Lightning's RunIf."""
    reasons = []
    if min_cuda_gpus and torch.cuda.device_count() < min_cuda_gpus:
        reasons.append(f"GPUs>={min_cuda_gpus}")
    if min_torch and _torch_version() < Version(min_torch):
        reasons.append(f"torch>={min_torch}")
    if max_torch and _torch_version() >= Version(max_torch):
        reasons.append(f"torch<{max_torch}")
    if min_python and sys.version_info[:3] < tuple(int(p) for p in min_python.split(".")):
        reasons.append(f"python>={min_python}")
    if bf16_cuda and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        reasons.append("CUDA with bf16")
    if tpu:
        reasons.append("TPU")  # the framework has no TPU/XLA backend
    mps_here = torch.backends.mps.is_available()
    if mps is True and not mps_here:
        reasons.append("MPS")
    if mps is False and mps_here:
        reasons.append("no MPS")
    if skip_windows and sys.platform == "win32":
        reasons.append("not Windows")
    if linux_only and not sys.platform.startswith("linux"):
        reasons.append("Linux")
    if standalone and os.getenv("PL_RUN_STANDALONE_TESTS", "0") != "1":
        reasons.append("standalone execution")
    if dynamo and (sys.platform == "win32" or not hasattr(torch, "compile")):
        reasons.append("torch.dynamo")
    for wanted, package in ((deepspeed, "deepspeed"), (rich, "rich"), (omegaconf, "omegaconf"), (psutil, "psutil"),
                            (sklearn, "sklearn"), (onnx, "onnx"), (onnxscript, "onnxscript"),
                            (tensorrt, "torch_tensorrt")):  # fmt: skip
        if wanted and not _installed(package):
            reasons.append(package)
    return reasons


def RunIf(**kwargs: Any) -> pytest.MarkDecorator:  # noqa: N802 - Lightning's name
    """A ``skipif`` marker listing every requirement of ``kwargs`` that is not met."""
    reasons = _reasons(**kwargs)
    flags = {k: True for k in ("min_cuda_gpus", "standalone", "tpu") if kwargs.get(k)}
    return pytest.mark.skipif(bool(reasons), reason=f"Requires: [{' + '.join(reasons)}]", **flags)


#: Lightning expects a gloo failure on Windows with recent torch; it never applies on Linux.
_xfail_gloo_windows = pytest.mark.xfail(RuntimeError, strict=True, condition=sys.platform == "win32",
                                        reason="gloo device on Windows")  # fmt: skip
