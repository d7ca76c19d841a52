"""The Python blocks of README.md and docs/*.md, and a runner that executes each as a reader would: a script of its
own (``block.py`` in a fresh folder, run as ``__main__``), with the blocks it continues before it.

Markers, on the block's leading comment lines:

- ``# fragment: continues <X>``: the block continues an earlier block of the same page, the last one that sits under
  the heading X or whose first line starts with X; it runs after that block (and what that one continues), in one
  script.
- ``# needs: cuda`` (``cuda:4``: four GPUs), ``# needs: multi-node``, ``# needs: slurm``, ``# needs: <package>``
  (e.g. ``accelerate``): skipped, with that reason, where this machine has too few CUDA devices, this is not a
  multi-node or SLURM job, or the package is not installed. Blocks that need CUDA run in a plain subprocess with
  the GPUs visible; the runner hides them from the others (``CUDA_VISIBLE_DEVICES=""``), so ``Trainer(devices=8)``
  means 8 CPU processes wherever the test runs.

Importing torch and the framework takes seconds on a loaded machine, so a runner process imports them once and forks
a child per block (before any torch op, so no thread pool is copied); the child runs ``block.py`` with ``runpy`` as
``__main__``, so a block that starts more processes (``Trainer(devices=2)`` re-runs its script) works as for a reader.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
FRAGMENT = re.compile(r"#\s*fragment:\s*continues\s+(.+?)\s*$")
NEEDS = re.compile(r"#\s*needs:\s*(.+?)\s*$")


@dataclasses.dataclass
class Block:
    """One ```python block: where it is, its code, and its markers."""

    page: str
    line: int  # of the block's first code line
    heading: str
    code: str
    continues: Optional[str] = None
    needs: tuple[str, ...] = ()
    previous: Optional["Block"] = None  # the block it continues, once resolved

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first_line(self) -> str:
        return next((line.strip() for line in self.code.splitlines() if line.strip()), "")

    def chain(self) -> list["Block"]:
        """The blocks to run, in order: those it continues, then itself."""
        return ([*self.previous.chain()] if self.previous else []) + [self]

    def all_needs(self) -> tuple[str, ...]:
        return tuple(need for block in self.chain() for need in block.needs)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(page: Path) -> list[Block]:
    """Every ```python block of ``page``, its markers read and its fragment reference resolved (an unresolvable
    reference is left for the test to report)."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    heading, fence, start = "", None, 0
    for index, line in enumerate(lines):
        stripped = line.strip()
        if fence is None and stripped.startswith("#") and not line.startswith(" "):
            heading = stripped.lstrip("#").strip()
        if fence is None and stripped.startswith("```"):
            fence, start = stripped[3:].strip(), index + 1
        elif fence is not None and stripped.startswith("```"):
            if fence == "python":
                found.append(_block(page, start, heading, "\n".join(lines[start:index]) + "\n"))
            fence = None
    for position, block in enumerate(found):
        if block.continues is not None:
            earlier = [b for b in found[:position] if b.heading == block.continues or b.first_line.startswith(block.continues)]
            block.previous = earlier[-1] if earlier else None
    return found


def _block(page: Path, start: int, heading: str, code: str) -> Block:
    block = Block(str(page.relative_to(ROOT)), start + 1, heading, code)
    for line in code.splitlines():
        if not line.startswith("#"):
            break
        fragment, needs = FRAGMENT.match(line), NEEDS.match(line)
        if fragment:
            block.continues = fragment.group(1)
        if needs:
            block.needs += tuple(n.strip() for n in needs.group(1).split(",") if n.strip())
    return block


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks_of(page)]


def missing_need(block: Block) -> Optional[str]:
    """Why this machine cannot run ``block`` (a ``# needs:`` it lacks), or None."""
    for need in block.all_needs():
        kind, _, count = need.lower().partition(":")
        if kind in ("cuda", "gpu"):
            import torch

            if torch.cuda.device_count() < int(count or 1):
                return f"{block.name} needs {count or 1} CUDA GPU(s) (# needs: {need})"
        elif kind == "multi-node":
            if "NODE_RANK" not in os.environ and os.environ.get("SLURM_NNODES", "1") == "1":
                return f"{block.name} starts a job over several machines (# needs: {need})"
        elif need.lower() == "slurm":
            if "SLURM_NTASKS" not in os.environ:
                return f"{block.name} runs inside a SLURM job (# needs: slurm)"
        elif importlib.util.find_spec(need) is None:
            return f"{block.name} needs the package '{need}', which is not installed (# needs: {need})"
    return None


def needs_cuda(block: Block) -> bool:
    return any(need.lower().partition(":")[0] in ("cuda", "gpu") for need in block.all_needs())


def block_environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}  # fmt: skip
    for name in ("TRAINER_CONFIG", "TRAINER_ARGS"):
        env.pop(name, None)
    return env


def run_plain(code: str, cwd: Path, timeout: float) -> tuple[Optional[int], bool, str]:
    """Run ``code`` as ``cwd/block.py`` in a fresh interpreter (blocks that need the GPU)."""
    (cwd / "block.py").write_text(code)
    try:
        result = subprocess.run([sys.executable, "block.py"], cwd=cwd, env=block_environment(), capture_output=True,
                                text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as err:
        return None, True, str(err.stdout or "") + str(err.stderr or "")
    return result.returncode, False, result.stdout + result.stderr


def script_of(block: Block) -> str:
    """The code run for ``block``: each block of its chain, separated by a comment naming where it comes from."""
    return "".join(f"# --- {b.name}\n{b.code}" for b in block.chain())


# ---------------------------------------------------------------------------------------------- the runner
RUNNER = r'''
import json, os, runpy, signal, sys, time, traceback
import torch, trainer, trainer.callbacks, trainer.loggers, trainer.strategies  # once, for every block
import torch._dynamo, torch.utils.tensorboard, torchmetrics, yaml  # what a fit loads (an optimizer imports dynamo)
from trainer.callbacks import ModelCheckpoint, ModelSummary, RichProgressBar
from trainer.callbacks.fit_report import FitReport
from trainer.loggers import CSVLogger, TensorBoardLogger
from trainer.engine.engine import Engine
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        os.chdir(request["cwd"])
        out = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.argv = ["block.py"]
        sys.path[0] = request["cwd"]
        status = 0
        try:
            runpy.run_path("block.py", run_name="__main__")
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    deadline = time.monotonic() + request["timeout"]
    timed_out, status = False, None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
        else:
            time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # what the block started and left running
    except ProcessLookupError:
        pass
    print(json.dumps({"status": status, "timed_out": timed_out}), flush=True)
'''


class Runner:
    """A process that has imported torch and the framework, running blocks in forked children."""

    def __init__(self) -> None:
        env = {**block_environment(), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        self.process = subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env, cwd=ROOT)  # fmt: skip

    def run(self, code: str, cwd: Path, timeout: float) -> tuple[Optional[int], bool, str]:
        """Run ``code`` as ``cwd/block.py``; returns (exit status, timed out, its output)."""
        (cwd / "block.py").write_text(code)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"cwd": str(cwd), "timeout": timeout}) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            raise RuntimeError(f"the docs block runner exited (status {self.process.poll()})")
        result = json.loads(reply)
        output = (cwd / "output.txt").read_text(errors="replace") if (cwd / "output.txt").exists() else ""
        return result["status"], result["timed_out"], output

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
