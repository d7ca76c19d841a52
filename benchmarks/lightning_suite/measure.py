"""Steps 5 and 6: run the test files under pytest, one process per file, and keep a junit XML of each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

#: pytest.ini written into both trees: Lightning's own settings (pyproject.toml at the tag) that change outcomes.
PYTEST_INI = """\
[pytest]
xfail_strict = true
filterwarnings =
    error::FutureWarning
    ignore::FutureWarning:onnxscript
    ignore:You are using `torch.load` with `weights_only=False`.*:FutureWarning
    ignore::FutureWarning:torch.distributed.algorithms.ddp_comm_hooks
    ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated.*:FutureWarning
"""


@dataclass(frozen=True)
class Side:
    """One measurement run: which interpreter runs which tree, with which import path."""

    name: str  # "lightning" (the baseline) or "ours"
    python: str
    tree: Path  # the folder holding tests_pytorch/ and pytest.ini
    pythonpath: tuple[str, ...]


def _env(side: Side, missing_log: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PL_", "LT_", "PYTEST_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([*side.pythonpath, str(side.tree)]),
        OMP_NUM_THREADS="1",  # the box is shared: one core per run
        MKL_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONDONTWRITEBYTECODE="1",
        LT_MISSING_LOG=str(missing_log),
    )
    return env


def junit_path(results: Path, test_file: str) -> Path:
    """Where the junit XML of one file of one side goes."""
    return results / (test_file.replace("/", "__").removesuffix(".py") + ".xml")


def run_file(side: Side, test_file: str, results: Path, timeout: int, file_timeout: int, what: str,
             ) -> tuple[str, int, float]:  # fmt: skip
    """Run one test file; returns (file, pytest's exit code or -9 when killed, seconds). ``what`` (the code
    under test) is recorded beside the XML with the time, for the report's header."""
    xml = junit_path(results, test_file)
    missing_log = xml.with_suffix(".missing.jsonl")
    for old in (xml, missing_log):
        old.unlink(missing_ok=True)
    cmd = [side.python, "-m", "pytest", f"tests_pytorch/{test_file}", "-p", "no:cacheprovider", "-q",
           "--tb=short", "-rN", f"--timeout={timeout}", f"--junitxml={xml}", "-o", "junit_logging=no",
           "-o", "console_output_style=classic"]  # fmt: skip
    log = results / (xml.stem + ".log")
    start = time.monotonic()
    with open(log, "w") as out:
        try:
            rc = subprocess.run(cmd, cwd=side.tree, env=_env(side, missing_log), stdout=out, stderr=subprocess.STDOUT,
                                timeout=file_timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = -9
            out.write(f"\n[harness] killed after {file_timeout}s\n")
    info = {"what": what, "timeout": timeout, "exit": rc, "ended": time.strftime("%Y-%m-%d %H:%M")}
    xml.with_suffix(".run.json").write_text(json.dumps(info) + "\n")
    return test_file, rc, time.monotonic() - start


def run_side(side: Side, test_files: list[str], results: Path, timeout: int, file_timeout: int, jobs: int,
             what: str) -> None:  # fmt: skip
    """Run every file of one side (``jobs`` files at a time), printing one line per file as it ends."""
    results.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = pool.map(lambda f: run_file(side, f, results, timeout, file_timeout, what), test_files)
        for test_file, rc, secs in runs:
            print(f"[{side.name}] {test_file}: exit {rc} in {secs:.0f}s", file=sys.stderr, flush=True)


def write_ini(tree: Path) -> None:
    """Put the shared pytest settings at the root of a tree (pytest then takes that folder as rootdir)."""
    (tree / "pytest.ini").write_text(PYTEST_INI)
