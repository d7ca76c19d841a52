"""First step of ``make gpu-check``: is there a CUDA GPU this Python's torch can use? Prints what it found.

Exits non-zero with advice when torch is missing or sees no GPU (a CPU build, no driver, no device).
"""
from __future__ import annotations

import sys


def main() -> int:
    try:
        import torch
    except ImportError:
        print(f"make gpu-check: {sys.executable} has no torch. Set GPU_PYTHON to a Python with a CUDA build of torch.")
        return 1
    if not torch.cuda.is_available():
        print(f"make gpu-check: torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'}) at "
              f"{sys.executable} sees no CUDA GPU. Run it on a machine with one, or set GPU_PYTHON to a Python "
              "whose torch has CUDA.")  # fmt: skip
        return 1
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
