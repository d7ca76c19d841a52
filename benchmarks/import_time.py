"""What ``import trainer`` costs beyond ``import torch``, measured in fresh interpreters.

Each repeat starts two new Python processes (``import torch`` and ``import torch, trainer``) and reads the
in-process time of the imports; the medians are compared. Target: at most 0.10 s. Also lists heavy
optional packages and parts of torch that must not be imported eagerly (tensorboard, rich, torchmetrics,
torch._dynamo, torch.profiler beyond what ``import torch`` loads, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_PROBE = """
import json, sys, time
start = time.perf_counter()
import torch
after_torch = time.perf_counter()
with_torch = set(sys.modules)
if {with_trainer}:
    import trainer
end = time.perf_counter()
heavy = [m for m in ("tensorboard", "rich", "torchmetrics", "mlflow", "wandb", "deepspeed", "matplotlib", "yaml",
                     "torch._dynamo", "torch._inductor", "torch.profiler", "torch.utils.flop_counter",
                     "torch.distributed.tensor", "torch.distributed.pipelining")
         if m in sys.modules and m not in with_torch]
print(json.dumps({{"torch": after_torch - start, "extra": end - after_torch, "heavy": heavy}}))
"""


# Users' installs keep compiled bytecode; with PYTHONDONTWRITEBYTECODE set every probe would recompile
# the project's sources and measure the compiler instead of the import.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def probe(with_trainer: bool) -> dict:
    """Times ``import torch`` (and ``import trainer`` after it) in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _PROBE.format(with_trainer=with_trainer)],
                         capture_output=True, text=True, check=True, env=_ENV)  # fmt: skip
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    probe(True)  # warm the file cache and bytecode
    extras, torch_times, heavy = [], [], []
    for _ in range(args.repeats):
        torch_times.append(probe(False)["torch"])
        result = probe(True)
        extras.append(result["extra"])
        heavy = result["heavy"]
    extra = statistics.median(extras)
    print(f"import torch            {statistics.median(torch_times):.3f} s (median of {args.repeats})")
    print(f"import trainer beyond   {extra:.3f} s (target <= 0.100 s)")
    print(f"heavy optional modules imported by `import trainer`: {heavy or 'none'}")


if __name__ == "__main__":
    main()
