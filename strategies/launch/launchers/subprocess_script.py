"""``strategy="ddp"`` from a plain ``python train.py``: start ranks 1..N-1 by re-running the same command.

The current process becomes local rank 0 and runs the stage itself; the others run the whole script
from the top with ``LOCAL_RANK``/``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set, so their
Trainers join instead of launching. A watcher thread turns a failed rank into a stopped job: it prints
one line, terminates the other ranks, and exits this process if it has not stopped by itself shortly after.
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

from torch.distributed import DistError

from trainer.strategies.launch.environments.local import LocalEnvironment
from trainer.strategies.errors import ConfigurationError, RankFailedError

POLL_INTERVAL_S = 0.2
#: How long a rank whose collective lost its peer waits to learn which rank exited.
PEER_EXIT_WAIT_S = 2.0
#: After another rank failed, this process gets this long to stop by itself (it normally does at its next
#: collective, within a second on gloo) before it is ended so no rank waits for the process-group timeout.
HARD_EXIT_AFTER_S = 15.0
#: Grace between SIGTERM and SIGKILL when this process stops the others.
TERMINATE_GRACE_S = 5.0
#: How long a finished rank 0 waits for the other ranks to finish the script before stopping them.
CHILD_EXIT_TIMEOUT_S = 120.0


def script_command() -> list[str]:
    """The command that started this process, to run again for the other ranks (or a clear error)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        if name in ("pytest", "py.test", "_pytest"):
            raise ConfigurationError(
                "strategy='ddp' starts the other ranks by re-running the command that started this process, and "
                "that command is pytest. Put the training in a script and run it in a subprocess, or use "
                "strategy='ddp_spawn'."
            )
        return [sys.executable, "-m", name, *sys.argv[1:]]
    script = getattr(main, "__file__", None)
    if hasattr(sys, "ps1") or script is None or not sys.argv or sys.argv[0] in ("", "-c"):
        raise ConfigurationError(
            "strategy='ddp' starts the other ranks by re-running this program's command, but this is an interactive "
            "session (or `python -c`), which cannot be re-run. Save the code as a script and run "
            "`python train.py` (or use torchrun), or use devices=1."
        )
    if os.path.basename(sys.argv[0]) in ("pytest", "py.test"):
        raise ConfigurationError(
            "strategy='ddp' re-runs the command that started this process, and that command is pytest. Put the "
            "training in a script and run it in a subprocess, or use strategy='ddp_spawn'."
        )
    return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]


def _lost_a_peer(exc: BaseException) -> bool:
    """True for the error a collective raises when another rank's process went away."""
    if isinstance(exc, DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("peer" in text or "connection" in text)


def _say(message: str) -> None:
    print(f"[trainer] {message}", file=sys.stderr, flush=True)


class _ChildWatcher(threading.Thread):
    """Polls the started ranks; on the first non-zero exit it stops the job (see the module docstring)."""

    def __init__(self, children: list[tuple[int, subprocess.Popen]], own_rank: int) -> None:
        super().__init__(name="trainer-rank-watcher", daemon=True)
        self.children = children
        self.own_rank = own_rank
        self.failure: Optional[tuple[int, int]] = None  # (global rank, exit code)
        self.failed = threading.Event()
        self.stopping = False  # set when this process stops the others itself: their exits are expected

    def run(self) -> None:
        running = list(self.children)
        while running and not self.stopping:
            time.sleep(POLL_INTERVAL_S)
            for rank, proc in list(running):
                code = proc.poll()
                if code is None:
                    continue
                running.remove((rank, proc))
                if code != 0 and not self.stopping:
                    self._stop_job(rank, code)
                    return

    def _stop_job(self, rank: int, code: int) -> None:
        self.failure = (rank, code)
        self.failed.set()
        _say(f"rank {rank} {how_it_ended(code)}; stopping the other ranks.")
        terminate(self.children)
        time.sleep(HARD_EXIT_AFTER_S)
        _say(f"rank {self.own_rank} did not stop within {HARD_EXIT_AFTER_S:.0f} s after rank {rank} failed; exiting.")
        sys.stdout.flush()
        os._exit(1)


def how_it_ended(code: int, detail: bool = False) -> str:
    """``exited with code 1 (its traceback is printed above)``, or, for a negative ``Popen`` return code, the signal
    that killed the process: then there is no Python traceback, and ``detail`` says what usually sends it."""
    if code >= 0:
        return f"exited with code {code}" + (" (its traceback is printed above)" if detail else "")
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    text = f"was killed by {name} (signal {-code})"
    if not detail:
        return text
    causes = {
        "SIGKILL": "no traceback: a process killed this way cannot print one. The kernel's out-of-memory killer "
                   "sends it (see `dmesg`), as do `kill -9` and schedulers enforcing a memory or time limit",
        "SIGABRT": "no Python traceback: native code aborted; its message, if any, is printed above (e.g. "
                   "gloo's 'collective mismatch')",
        "SIGSEGV": "no Python traceback: a crash in native code (an extension, a driver); run it with "
                   "PYTHONFAULTHANDLER=1 to print the Python stack of such a crash",
        "SIGTERM": "no traceback: something outside the job stopped it (a scheduler, `kill`)",
    }
    return f"{text}: {causes.get(name, 'no Python traceback')}"


def terminate(children: list[tuple[int, subprocess.Popen]]) -> None:
    """SIGTERM every running process, then SIGKILL those still alive after a grace period."""
    alive = [proc for _, proc in children if proc.poll() is None]
    for proc in alive:
        proc.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for proc in alive:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class SubprocessScriptLauncher:
    """Launches the other local ranks of a ``ddp`` job as subprocesses running this script's command."""

    #: The stage runs in the calling process (local rank 0), so its state needs no transfer back.
    runs_in_caller = True

    def __init__(self, environment: LocalEnvironment, num_processes: int) -> None:
        self.environment = environment
        self.num_processes = num_processes
        self.command: list[str] = []
        self.children: list[tuple[int, subprocess.Popen]] = []
        self._watcher: Optional[_ChildWatcher] = None
        self._stopped_after_own_failure = False  # then the other ranks' exit codes are this process's doing

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Start the other ranks once (on the first stage), then run ``fn(*args)`` here as local rank 0."""
        if not self.environment.creates_processes_externally and self.environment.world_size() > 1:
            self.environment.check_launch()
            self._start_children()  # (one process in all: nothing to start, e.g. a one-device FSDP run under pytest)
        watcher = self._watcher
        if watcher is not None and watcher.failure is not None:
            raise self._peer_error(watcher.failure)
        try:
            return fn(*args)
        except BaseException as exc:
            self._stop_after_failure(exc)
            raise

    def _start_children(self) -> None:
        env = self.environment
        self.command = script_command()
        for local_rank in range(1, self.num_processes):
            child_env = {**os.environ, **env.launch_variables(local_rank)}
            proc = subprocess.Popen(self.command, env=child_env)
            self.children.append((int(child_env["RANK"]), proc))
        os.environ.update(env.launch_variables(0))  # this process is now local rank 0 of a launched job
        self._watcher = _ChildWatcher(self.children, env.global_rank())
        self._watcher.start()
        atexit.register(self._wait_for_children)

    def _stop_after_failure(self, exc: BaseException) -> None:
        watcher = self._watcher
        if watcher is None:
            return
        if watcher.failure is None and _lost_a_peer(exc):
            # The collective failed about when the peer exited: give the watcher a moment to see that exit,
            # so the report names the rank that failed first.
            watcher.failed.wait(PEER_EXIT_WAIT_S)
        failure = watcher.failure
        watcher.stopping = True
        self._stopped_after_own_failure = True
        terminate(self.children)
        if failure is not None and not isinstance(exc, KeyboardInterrupt):
            raise self._peer_error(failure) from None

    def _peer_error(self, failure: tuple[int, int]) -> RankFailedError:
        rank, code = failure
        return RankFailedError(f"rank {rank} {how_it_ended(code, detail=True)}, so rank "
                               f"{self.environment.global_rank()} stopped too.")  # fmt: skip

    def _wait_for_children(self) -> None:
        """At exit: let the other ranks finish the script, and make the exit code say if one failed."""
        watcher = self._watcher
        if watcher is not None:
            watcher.stopping = True  # from here on, exits are this function's business
        if hasattr(sys, "last_value"):
            # This process ends with an uncaught error (its traceback is printed and the exit code says so):
            # the other ranks may be waiting in a collective for it, so stop them instead of waiting.
            terminate(self.children)
            return
        deadline = time.monotonic() + CHILD_EXIT_TIMEOUT_S
        for rank, proc in self.children:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                _say(f"rank {rank} is still running {CHILD_EXIT_TIMEOUT_S:.0f} s after rank 0 finished; stopping it.")
                terminate([(rank, proc)])
        failed = [(rank, proc.returncode) for rank, proc in self.children if proc.returncode not in (0, None)]
        stopped_here = watcher is not None and watcher.failure is None and self._stopped_after_own_failure
        if failed and not stopped_here:
            if watcher is None or watcher.failure is None:
                _say(f"rank {failed[0][0]} {how_it_ended(failed[0][1])}.")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def __repr__(self) -> str:
        return f"SubprocessScriptLauncher(num_processes={self.num_processes}, command={self.command!r})"
