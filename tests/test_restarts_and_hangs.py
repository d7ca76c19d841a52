"""Jobs that heal themselves or end with a name: an elastic restart resumes bit-exactly; a rank that stops answering
ends the whole job within a minute, named with the step."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
from launching import SCRIPTS, finish, start, trainer_command


def test_an_elastic_restart_resumes_from_the_newest_checkpoint_bit_exactly(tmp_path: Path) -> None:
    output = finish(start(trainer_command("run", "--devices", "2", "--max-restarts", "1",
                                          str(SCRIPTS / "elastic_resume.py"), str(tmp_path))), timeout=180)  # fmt: skip
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    reference = torch.load(tmp_path / "reference.pt", weights_only=True)
    assert "workers restarted by the elastic agent (restart 1): resuming from" in output, output
    assert Path(resumed["resumed_from"]).name == "epoch=1-step=15.ckpt"  # the newest before the kill at step 17
    assert resumed["global_step"] == reference["global_step"] == 20 and reference["resumed_from"] is None
    for name, value in reference["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name


def test_a_stopped_rank_ends_the_job_within_a_minute_naming_it_and_the_step(tmp_path: Path) -> None:
    ready = tmp_path / "stopped-pid"
    job = start([sys.executable, str(SCRIPTS / "hang_rank.py"), str(ready)])
    stopped_pid = None
    try:
        deadline = time.monotonic() + 120
        while not (ready.exists() and ready.read_text()) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), "rank 1 never reached step 5"
        stopped_pid = int(ready.read_text())
        since_stop = time.monotonic()
        output = finish(job, timeout=60, expect=1)
        elapsed = time.monotonic() - since_stop
        assert "HangError: The job hung after global step 5" in output and "rank 1 stopped answering" in output, output
        assert elapsed < 60
        assert not _alive(stopped_pid), "the stopped rank outlived the job"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
        if stopped_pid is not None and _alive(stopped_pid):
            os.kill(stopped_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
