"""conftest.py of the renamed test package: the fixtures Lightning's measured files use, on our framework.

Only test hygiene lives here (put back environment variables, signal handlers, determinism and the process
group after each test; let ``caplog`` see the framework's log records). None of it changes what the framework
does during a test. Copied to ``<work>/ours/tests_pytorch/conftest.py`` by the harness.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed

_SIGNALS = [s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)]


@pytest.fixture(autouse=True)
def restore_env_variables() -> Iterator[None]:
    """Environment variables a test sets do not reach the next test."""
    saved = os.environ.copy()
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def restore_signal_handlers() -> Iterator[None]:
    """Signal handlers a test (or a Trainer it left unfinished) installs are put back."""
    saved = {s: signal.getsignal(s) for s in _SIGNALS}
    yield
    for signum, handler in saved.items():
        if handler is not None:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def teardown_process_group() -> Iterator[None]:
    """A process group a test leaves open is closed before the next one."""
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def reset_deterministic_algorithm() -> Iterator[None]:
    """``torch.use_deterministic_algorithms`` is off again after each test."""
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` that also sees records of the framework's loggers when they do not propagate."""
    names = [n for n in logging.root.manager.loggerDict if n == "trainer" or n.startswith("trainer.")]
    saved = {n: logging.getLogger(n).propagate for n in names}
    root_saved = logging.getLogger().propagate
    for n in names:
        logging.getLogger(n).propagate = True
    yield caplog
    logging.getLogger().propagate = root_saved
    for n, value in saved.items():
        logging.getLogger(n).propagate = value


@pytest.fixture
def single_process_pg() -> Iterator[None]:
    """A gloo process group of this process alone, closed afterwards."""
    if torch.distributed.is_initialized():
        raise RuntimeError("single_process_pg needs no process group to be open already")
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    saved = os.environ.copy()
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo")
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)
