"""Instructions per training step, Trainer against the hand-written loop, counted by callgrind.

Wall-clock ratios (overhead.py) move by a few percent with machine load; an instruction count does not. Each side
runs the tiny workload of overhead.py twice under ``valgrind --tool=callgrind --instr-atstart=no``, once with
``--short`` steps and once with ``--long`` steps, counting only from just before the loop (or ``trainer.fit``) to
just after it (``callgrind_control -i on/off``). The difference of the two counts divided by the difference of
the step counts is the per-step work: set-up, the first-call costs and the fit's start and end cancel out.

    python benchmarks/instructions.py                 # tiny workload, 50 and 350 steps (about ten minutes)
    python benchmarks/instructions.py --long 350      # more steps: less noise from the allocator's state

Needs valgrind (``apt install valgrind``). Each run uses ``PYTHONHASHSEED=0``: with random string hashes, dict probe
lengths (and so the count) move by ~10 K instructions a step between runs of the same code. The rest of the noise is
pybind11's registry of torch objects (a hash-table lookup whose cost follows the heap's layout); the second figure
leaves that function out.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


class _CallgrindToggle:
    """Stands in for overhead.py's clock: the first call (loop start) switches counting on, the next one off."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self) -> float:
        self.on = not self.on
        subprocess.run(["callgrind_control", "-i", "on" if self.on else "off", str(os.getpid())],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        return 0.0


def run_child(side: str, steps: int) -> None:
    """Inside valgrind: build the workload, then run one side with counting on around the loop only."""
    sys.path.insert(0, str(HERE))
    import torch

    import overhead

    torch.set_num_threads(1)
    workload = overhead.WORKLOADS["tiny"]
    loader = overhead.make_loader(workload["sizes"], workload["batch"], steps)
    overhead.clock = _CallgrindToggle()
    if side == "raw":
        overhead.run_raw(workload["sizes"], loader)
    else:
        with tempfile.TemporaryDirectory() as root:
            overhead.run_trainer(workload["sizes"], loader, defaults=False, root=root)


def count(side: str, steps: int, workdir: str) -> tuple[int, int]:
    """Run one side under callgrind; return the instructions it counted, and those of them spent in pybind11's
    registry of torch objects (a hash-table lookup whose cost moves by ~10 K instructions a step from run to run with
    the heap's layout, whatever the Python code does)."""
    out = os.path.join(workdir, f"{side}-{steps}.out")
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         sys.executable, __file__, "--child", side, str(steps)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # string hashes, hence dict probe lengths, the same every run
    )  # fmt: skip
    total = registry = 0
    for path in Path(workdir).glob(f"{side}-{steps}.out*"):  # one file per dump (callgrind_control may add some)
        match = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)  # "summary:" may read 0
        total += int(match.group(1)) if match else 0
        report = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", str(path)],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        for line in report.splitlines():
            cost = re.match(r"\s*([\d,]+)\s", line)
            if cost and "pybind11" in line:
                registry += int(cost.group(1).replace(",", ""))
    return total, registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", type=int, default=50)
    parser.add_argument("--long", type=int, default=350)
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child[0], int(args.child[1]))
        return
    per_step, steady = {}, {}
    span = args.long - args.short
    with tempfile.TemporaryDirectory() as workdir:
        for side in ("raw", "trainer"):
            (short, short_reg), (long, long_reg) = count(side, args.short, workdir), count(side, args.long, workdir)
            per_step[side] = (long - short) / span
            steady[side] = (long - long_reg - short + short_reg) / span
            print(f"{side:<8} {args.short} steps {short:>14,}   {args.long} steps {long:>14,}   per step "
                  f"{per_step[side]:>12,.0f}   without pybind11's registry {steady[side]:>12,.0f}")  # fmt: skip
    for label, figures in (("", per_step), (" without pybind11's registry", steady)):
        extra = figures["trainer"] - figures["raw"]
        print(f"Trainer extra per step{label}: {extra:+,.0f} instructions ({extra / figures['raw']:+.2%} of the raw "
              "step)")


if __name__ == "__main__":
    main()
