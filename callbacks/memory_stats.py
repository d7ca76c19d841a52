"""Reading memory use cheaply: process RSS and peak RSS from the OS, CUDA figures from PyTorch's allocator.

None of these synchronise the device; each read is a few microseconds.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import torch

MB = 1024 * 1024


def rss_bytes() -> Optional[int]:
    """Resident set size of this process now (Linux ``/proc``), or ``None`` where unavailable."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def peak_rss_bytes() -> Optional[int]:
    """Highest resident set size this process has reached, or ``None`` where unavailable (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS reports bytes, Linux KiB
    return max(peak, rss_bytes() or 0)  # the kernel updates the high-water mark lazily: it can lag RSS


def cuda_stats(device: torch.device) -> dict[str, int]:
    """``allocated``, ``max_allocated`` and ``reserved`` bytes on a CUDA device (empty for other devices)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return {}
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "max_allocated": torch.cuda.max_memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
    }


def format_bytes(value: Optional[float]) -> str:
    """``1536 MB`` / ``2.25 GB`` style text; ``-`` for unknown."""
    if value is None:
        return "-"
    if value >= 1024 * MB:
        return f"{value / (1024 * MB):.2f} GB"
    return f"{value / MB:.0f} MB"
