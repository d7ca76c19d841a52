"""Fault tolerance across replica groups (``ft_ddp``, torchft): a group killed mid-run does not stop the others, and
its restarted replacement heals from a live peer; when every group dies, the usual auto-resume restarts the job.

Real parts: torchft's lighthouse binary, one-process replica groups on gloo, SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import torch

pytest.importorskip("torchft", reason="fault tolerance needs torchft (the 'ft' extra)")

from launching import SCRIPTS  # noqa: E402

from trainer.strategies.launch.environments.local import find_free_port  # noqa: E402

GROUP = SCRIPTS / "ft_group.py"
LIGHTHOUSE = Path(sys.executable).parent / "torchft_lighthouse"


def _start(command: list[str], log: Path, env: Optional[dict[str, str]] = None) -> subprocess.Popen:
    """Start ``command`` in its own session, its output to ``log`` (torchft logs every quorum: a pipe nobody reads
    until the end would fill up and block the process)."""
    with open(log, "a") as sink:
        return subprocess.Popen(command, env=dict(os.environ if env is None else env, OMP_NUM_THREADS="1"),
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _finish(process: subprocess.Popen, log: Path, timeout: float) -> str:
    """Wait for ``process`` (killing its session on a hang) and return its log; fail unless it exited with 0."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        raise AssertionError(f"{' '.join(map(str, process.args))} did not finish in {timeout:.0f} s:\n{log.read_text()}")
    output = log.read_text()
    assert process.returncode == 0, f"{' '.join(map(str, process.args))} exited with {process.returncode}:\n{output}"
    return output


def _lighthouse(out: Path) -> tuple[subprocess.Popen, int]:
    port = find_free_port()
    process = _start([str(LIGHTHOUSE), "--min_replicas", "1", "--join_timeout_ms", "500", "--quorum_tick_ms", "50",
                      "--heartbeat_timeout_ms", "1000", "--bind", f"[::]:{port}"], out / "lighthouse.log")  # fmt: skip
    return process, port


def _group(out: Path, replica: int, lighthouse: int, groups: int, *args: str, log: str = "",
           ranks: int = 1) -> subprocess.Popen:  # fmt: skip
    """One replica group: the script itself (one rank), or torchrun starting ``ranks`` of it."""
    env = dict(os.environ, REPLICA_GROUP_ID=str(replica), NUM_REPLICA_GROUPS=str(groups),
               TORCHFT_LIGHTHOUSE=f"localhost:{lighthouse}", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(find_free_port()))  # fmt: skip
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                                                  str(ranks), "--master_port", env["MASTER_PORT"]]  # fmt: skip
    return _start([*launch, str(GROUP), str(out), *args], out / (log or f"group-{replica}.log"), env)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a group: the process and every process it started (torchrun's workers run in sessions of their
    own, so killing the agent's session alone would leave them running)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    doomed, queue = [], [process.pid]
    while queue:
        pid = queue.pop()
        doomed.append(pid)
        queue.extend(children.get(pid, []))
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=30)


def _steps(out: Path, replica: int) -> list[tuple[int, float]]:
    path = out / f"steps-{replica}.txt"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(int(step), float(at)) for step, at in rows if step]


def _wait_for_step(out: Path, replica: int, step: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(s >= step for s, _ in _steps(out, replica)):
            return
        time.sleep(0.05)
    raise AssertionError(f"replica group {replica} did not reach step {step} within {timeout:.0f} s")


def _weights(out: Path, replica: int) -> dict:
    return torch.load(out / f"weights-{replica}.pt", weights_only=True)


def _assert_survived_and_healed(out: Path, killed_at: float, survivor_log: str, restarted_log: str, steps: int) -> None:
    """Group 0 kept stepping after ``killed_at``; group 1, restarted, healed from it; both end equal at ``steps``."""
    after = [(s, at) for s, at in _steps(out, 0) if at >= killed_at]
    assert after, survivor_log
    gaps = [b - a for (_, a), (_, b) in zip([(0, killed_at)] + after, after)]
    assert max(gaps) < 30, gaps  # no stall over 30 s
    assert all(b >= a for (a, _), (b, _) in zip(after, after[1:]))  # the global step only rose
    assert "1 group(s) left" in survivor_log, survivor_log
    assert "healed from a peer" in restarted_log, restarted_log
    assert (out / "opened-1.txt").read_text() == ""  # no checkpoint read
    a, b = _weights(out, 0), _weights(out, 1)
    assert a["global_step"] == b["global_step"] == steps
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name
    assert a["metrics"]["ft/samples_skipped"] > 0  # the dead group's batches of the steps it missed


def test_a_killed_hsdp_group_does_not_stop_the_other_and_heals_from_it_when_restarted(tmp_path):
    """ft_hsdp: two groups of 2 ranks (FSDP2 inside each, torchrun); one group SIGKILLed, then started again."""
    strategy, ranks, steps, kill_at = "ft_hsdp", 2, 40, 8
    # Slower while a group is missing: a restarted group takes 10-15 s to start on a loaded CPU.
    pace = ("--steps", str(steps), "--strategy", strategy, "--pause", "0.05", "--alone-pause", "1.0")
    lighthouse, port = _lighthouse(tmp_path)
    try:
        survivor = _group(tmp_path, 0, port, 2, *pace, ranks=ranks)
        victim = _group(tmp_path, 1, port, 2, *pace, ranks=ranks)
        _wait_for_step(tmp_path, 1, kill_at)
        _kill_group(victim)
        killed_at = time.time()
        restarted = _group(tmp_path, 1, port, 2, *pace, log="restarted-1.log", ranks=ranks)
        survivor_log = _finish(survivor, tmp_path / "group-0.log", timeout=150)
        restarted_log = _finish(restarted, tmp_path / "restarted-1.log", timeout=150)
    finally:
        os.killpg(lighthouse.pid, signal.SIGKILL)
        lighthouse.wait(timeout=30)

    _assert_survived_and_healed(tmp_path, killed_at, survivor_log, restarted_log, steps)


def test_trainer_run_replica_groups_keeps_going_when_a_group_dies_and_restarts_it_to_heal(tmp_path):
    """``trainer run --replica-groups 2 --max-restarts 1`` (ft_ddp, one process per group): group 1 SIGKILLs itself at
    step 10; group 0 keeps stepping, the launcher starts group 1 again, it heals from group 0 without reading a
    checkpoint, and both end bitwise equal at max_steps. Both groups checkpoint into one folder."""
    steps = 50
    log = tmp_path / "run.log"
    run = _start([sys.executable, "-m", "trainer", "run", "--replica-groups", "2", "--max-restarts", "1", str(GROUP),
                  str(tmp_path), "--steps", str(steps), "--pause", "0.05", "--alone-pause", "1.0", "--crash-at", "10",
                  "--ckpt-every", "10"], log)  # fmt: skip
    output = _finish(run, log, timeout=150)
    assert "replica group 1 exited with" in output and "restart 1 of 1" in output, output
    killed_at = next(at for step, at in _steps(tmp_path, 1) if step == 10)  # it died right after recording step 10
    _assert_survived_and_healed(tmp_path, killed_at, output, output, steps)
    # Both groups' ModelCheckpoint share one folder; one group wrote each checkpoint, whole.
    saved = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert [name for name in saved if name.endswith(f"step={steps}.ckpt")] and "last.ckpt" in saved, saved
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == steps


def test_when_every_group_dies_auto_resume_gives_the_weights_of_the_run_that_never_stopped(tmp_path):
    """One group (all of the job) killed at step 17, restarted with ``ckpt_path="last"``: it resumes from the step-15
    checkpoint and ends with exactly the weights of an uninterrupted run."""
    steps, args = 30, ("--steps", "30", "--ckpt-every", "5")
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir(), broken.mkdir()
    (lighthouse, port), (other_lighthouse, other_port) = _lighthouse(whole), _lighthouse(broken)  # two jobs at once
    try:
        uninterrupted = _group(whole, 0, port, 1, *args)
        crashed = _group(broken, 0, other_port, 1, *args, "--crash-at", "17", "--crash-group", "0")
        crashed.wait(timeout=120)
        assert crashed.returncode == -signal.SIGKILL, (broken / "group-0.log").read_text()
        resumed = _group(broken, 0, other_port, 1, *args, "--resume", log="resumed.log")
        _finish(uninterrupted, whole / "group-0.log", timeout=120)
        output = _finish(resumed, broken / "resumed.log", timeout=120)
    finally:
        for process in (lighthouse, other_lighthouse):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    assert ".ckpt" in (broken / "opened-0.txt").read_text(), output
    recorded = [step for step, _ in _steps(broken, 0)]
    assert recorded[16:18] == [17, 16], recorded  # died after step 17, resumed after the step-15 checkpoint
    a, b = _weights(whole, 0), _weights(broken, 0)
    assert a["global_step"] == b["global_step"] == steps
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name
