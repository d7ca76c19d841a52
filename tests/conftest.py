"""Shared fixtures: one thread per test process, and every test runs in its own temporary folder so
default_root_dir, logs and checkpoints never land in the repository. What a test changes in this process (the
environment, signal handlers, a process group an in-process run left) is put back after it, as Lightning's own
suite does, so one test's DDP port, Ray's SIGINT handler or a leftover group never decides a later test."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# The Makefile's default (`.venv/torch_extensions`, the environment's own folder): DeepSpeed's CPU op built by
# `make install` is found, and a build of another environment in the shared ~/.cache is not picked up.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))


@pytest.fixture(autouse=True)
def _isolated_run(tmp_path, monkeypatch):
    from helpers import restored_process_state

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    with restored_process_state():
        yield
        _destroy_leftover_process_group()


def _destroy_leftover_process_group() -> None:
    """An in-process fit keeps its group for a later stage, as in Lightning; the next test starts without it
    (a forked child would inherit it, and its store would hold the port that the environment still names)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def pytest_configure(config):
    from trainer.strategies.data_parallel.deepspeed import remove_stale_build_locks

    remove_stale_build_locks()  # a build killed in an earlier run would make the DeepSpeed tests wait forever
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one; make gpu-check runs them)")
