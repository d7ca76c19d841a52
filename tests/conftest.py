"""Shared fixtures: one thread per test process, and every test runs in its own temporary folder so
default_root_dir, logs and checkpoints never land in the repository."""
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
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    yield


def pytest_configure(config):
    from trainer.strategies.data_parallel.deepspeed import remove_stale_build_locks

    remove_stale_build_locks()  # a build killed in an earlier run would make the DeepSpeed tests wait forever
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one; make gpu-check runs them)")
