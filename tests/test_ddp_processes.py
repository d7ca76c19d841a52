"""DDP across real processes (gloo on the CPU): launched by the Trainer, by torchrun, by SLURM-like variables,
as two "nodes" on localhost, with ddp_spawn, and when a rank fails.

The jobs are independent, so they run a few at a time when the module starts (most of their time is
interpreter start-up) and each test checks its job's outcome. Every process is bounded by a timeout, and
the job script dumps its stacks and exits if it hangs, so a hang fails a test instead of blocking the suite.
"""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
import torch

from trainer.strategies.launch.environments.local import find_free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "ddp_train.py")
RUN_TIMEOUT_S = 150
JOBS_AT_ONCE = 3
_JOB_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TRAINER_SEED")  # fmt: skip

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(4 * RUN_TIMEOUT_S),
]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any job variables (the tests may themselves run under SLURM)."""
    env = {k: v for k, v in os.environ.items()
           if k not in _JOB_VARIABLES and not k.startswith(("SLURM_", "TORCHELASTIC_"))}  # fmt: skip
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


@dataclass
class Job:
    """Processes started together (one per launch: a plain run, each "node", each SLURM task)."""

    out: Path
    commands: list[tuple[list[str], dict[str, str]]]
    watch_for: Optional[str] = None  # a line to time the end of the job from
    codes: list[Optional[int]] = field(default_factory=list)
    output: str = ""
    seconds_after_line: Optional[float] = None
    timeout_s: float = RUN_TIMEOUT_S  # a job of many fits may take longer

    def run(self) -> "Job":
        procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for cmd, env in self.commands]  # fmt: skip
        seen_at = None
        try:
            deadline = time.monotonic() + self.timeout_s
            chunks = []
            for proc in procs:
                for line in proc.stdout:  # the stream ends when the launch and every rank it started exited
                    chunks.append(line)
                    if seen_at is None and self.watch_for and self.watch_for in line:
                        seen_at = time.monotonic()
                    if time.monotonic() > deadline:
                        break
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
            self.output = "".join(chunks)
            if seen_at is not None:
                self.seconds_after_line = time.monotonic() - seen_at
        finally:
            for proc in procs:
                proc.kill()
            self.codes = [proc.returncode for proc in procs]
        return self

    def reports(self) -> list[dict]:
        return [torch.load(path, weights_only=False) for path in sorted(self.out.glob("rank*.pt"))]

    def check_ok(self) -> list[dict]:
        assert self.codes and all(code == 0 for code in self.codes), f"exit codes {self.codes}\n{self.output[-8000:]}"
        return self.reports()


def script(out: Path, *args: str) -> list[str]:
    return [sys.executable, SCRIPT, "--out", str(out), *args]


def define_jobs(tmp: Path) -> dict[str, Job]:
    def folder(name: str) -> Path:
        path = tmp / name
        path.mkdir()
        return path

    jobs: dict[str, Job] = {}
    out = folder("plain")
    jobs["plain"] = Job(out, [(script(out, "--devices", "2", "--validate", "--more-fits"), clean_env())])
    for name, rank, extra in (("fail1", 1, ()), ("fail0", 0, ()), ("fail0_later", 0, ("--fail-later",))):
        out = folder(name)
        args = ("--devices", "2", "--fail-rank", str(rank), "--fail-batch", "3", *extra)
        jobs[name] = Job(out, [(script(out, *args), clean_env())], watch_for=f"boom from rank {rank}")
    out = folder("torchrun")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    jobs["torchrun"] = Job(out, [([*torchrun, *script(out, "--devices", "auto", "--ddp-options")[1:]], clean_env())])
    out = folder("slurm")
    slurm = dict(SLURM_NTASKS="2", SLURM_NNODES="1", SLURM_NTASKS_PER_NODE="2", SLURM_JOB_ID="4242",
                 SLURM_JOB_NAME="train", SLURM_NODELIST="127.0.0.[1-2]", SLURM_NODEID="0",
                 MASTER_PORT=str(find_free_port()))  # fmt: skip
    jobs["slurm"] = Job(out, [(script(out, "--devices", "2"), clean_env(**slurm, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)))
                              for r in (0, 1)])  # fmt: skip
    out = folder("two_nodes")
    nodes = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()))
    jobs["two_nodes"] = Job(out, [(script(out, "--devices", "1", "--num-nodes", "2"), clean_env(**nodes, NODE_RANK=str(n)))
                                  for n in (0, 1)])  # fmt: skip
    out = folder("spawn")
    jobs["spawn"] = Job(out, [(script(out, "--strategy", "ddp_spawn", "--fit-val"), clean_env())])
    return jobs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Job]:
    defined = define_jobs(tmp_path_factory.mktemp("ddp_jobs"))
    with concurrent.futures.ThreadPoolExecutor(JOBS_AT_ONCE) as pool:
        list(pool.map(Job.run, defined.values()))
    return defined


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=f"{key} differs")


# ---------------------------------------------------------------------------------------------- plain python
def test_plain_python_launch_trains_two_ranks_like_one_process_with_double_batch(jobs):
    rank0, rank1 = jobs["plain"].check_ok()
    assert (rank0["global_rank"], rank1["global_rank"]) == (0, 1)
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["pid"] != rank1["pid"]
    assert rank0["wrapper"]["type"] == "DistributedDataParallel"
    assert rank0["global_step"] == rank1["global_step"] == 8  # 2 epochs x 8 micro-batches / accumulation 2
    assert_same_weights(rank0["weights"], rank1["weights"], atol=0)
    assert_same_weights(rank0["weights"], rank0["reference"])


def test_ranks_see_disjoint_halves_in_sequential_order(jobs):
    rank0, rank1 = jobs["plain"].check_ok()
    for epoch in (0, 1):
        assert rank0["seen"][epoch] == list(range(0, 48, 2))
        assert rank1["seen"][epoch] == list(range(1, 48, 2))
    assert rank0["sampler"] == "DistributedSampler"


def test_sync_dist_logging_reduces_to_the_cross_rank_mean(jobs):
    rank0, rank1 = jobs["plain"].check_ok()
    assert rank0["rank_value"] == rank1["rank_value"] == pytest.approx(0.5)


def test_validation_counts_every_sample_once_across_ranks(jobs):
    # 7 samples on 2 ranks (4 + 3): padding would count one sample twice and change the mean.
    for rank in jobs["plain"].check_ok():
        assert rank["validate"][0]["val_loss"] == pytest.approx(rank["val_loss_one_process"], rel=1e-5)


def test_only_global_rank_zero_calls_the_logger(jobs):
    rank0, _ = jobs["plain"].check_ok()
    assert [p.name for p in jobs["plain"].out.glob("logger-pid*.txt")] == [f"logger-pid{rank0['pid']}.txt"]


def test_shuffled_loader_reshuffles_each_epoch_identically_on_every_rank(jobs):
    rank0, rank1 = jobs["plain"].check_ok()
    orders = []
    for epoch in (0, 1):
        first, second = rank0["shuffled_seen"][epoch], rank1["shuffled_seen"][epoch]
        assert sorted(first + second) == list(range(48))  # one shared permutation, split: same seed on both ranks
        orders.append(first)
    assert orders[0] != orders[1]  # set_epoch reshuffled
    assert_same_weights(rank0["shuffled_weights"], rank1["shuffled_weights"], atol=0)
    assert_same_weights(rank0["shuffled_weights"], rank0["shuffled_reference"])


def test_ranks_with_unequal_data_are_evened_instead_of_deadlocking(jobs):
    rank0, rank1 = jobs["plain"].check_ok()
    # use_distributed_sampler=False with 6 batches on rank 0 and 12 on rank 1: both run 6.
    assert rank0["uneven_batches_run"] == rank1["uneven_batches_run"] == 6
    assert rank0["uneven_global_step"] == rank1["uneven_global_step"] == 3
    assert "different numbers of training batches" in jobs["plain"].output


# ---------------------------------------------------------------------------------------------- external launchers
def test_torchrun_job_is_joined_not_relaunched(jobs):
    ranks = jobs["torchrun"].check_ok()
    assert len(ranks) == 2 and {r["world_size"] for r in ranks} == {2}  # devices="auto" followed --nproc-per-node
    assert len({r["pid"] for r in ranks}) == 2
    assert ranks[0]["wrapper"]["find_unused_parameters"] is True  # DDPStrategy options reach the wrapper
    assert ranks[0]["wrapper"]["gradient_as_bucket_view"] is True
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"], atol=0)
    assert_same_weights(ranks[0]["weights"], ranks[0]["reference"])


def test_processes_with_slurm_variables_join_one_job(jobs):
    ranks = jobs["slurm"].check_ok()
    assert [r["global_rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"], atol=0)
    assert_same_weights(ranks[0]["weights"], ranks[0]["reference"])


def test_two_nodes_on_localhost_form_one_job(jobs):
    ranks = jobs["two_nodes"].check_ok()
    assert [(r["global_rank"], r["node_rank"], r["local_rank"]) for r in ranks] == [(0, 0, 0), (1, 1, 0)]
    for rank in ranks:
        assert rank["world_size"] == 2
        assert rank["seen"][0] == list(range(rank["global_rank"], 48, 2))
        assert_same_weights(rank["weights"], ranks[0]["reference"])


def test_ddp_spawn_hands_rank_zero_state_back_to_the_caller(jobs):
    (caller,) = jobs["spawn"].check_ok()  # only the calling process writes a report: the ranks were spawned
    assert caller["world_size"] == 2
    assert caller["global_step"] == 8 and caller["rank_value"] == pytest.approx(0.5)  # adopted from rank 0
    assert caller["state"] == ["fit", "finished"]  # trainer.state too, as Lightning's spawn launcher hands it back
    assert_same_weights(caller["weights"], caller["reference"])  # the caller's module holds the trained weights
    assert caller["val_loss_in_fit"] == pytest.approx(caller["val_loss_one_process"], rel=1e-5)
    assert len(caller["best_k_models"]) == 2 and all(os.path.exists(p) for p in caller["best_k_models"])
    assert not [w for w in caller["fit_warnings"] if "ModelCheckpoint" in w], caller["fit_warnings"]


# ---------------------------------------------------------------------------------------------- failures
@pytest.mark.parametrize(
    "name, failing_rank",
    [("fail1", 1), ("fail0", 0), ("fail0_later", 0)],
    ids=["launched-rank-fails", "launching-rank-fails", "launching-rank-fails-in-a-later-trainer"],
)
def test_a_failing_rank_stops_the_job_quickly_with_its_traceback_once(jobs, name, failing_rank):
    job = jobs[name]
    assert job.codes[0] != 0
    assert job.seconds_after_line is not None, job.output[-6000:]
    assert job.seconds_after_line < 30, job.output[-6000:]
    assert job.output.count(f"RuntimeError: boom from rank {failing_rank}") == 1, job.output[-6000:]
    assert not job.reports()  # no rank went on to finish the script
