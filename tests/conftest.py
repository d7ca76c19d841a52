"""Shared fixtures: one thread per test process, and every test runs in its own temporary folder so
default_root_dir, logs and checkpoints never land in the repository."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_run(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    yield


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one; make gpu-check runs them)")
