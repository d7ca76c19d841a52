"""ZeRO-1, ZeRO-2 and FSDP across real processes (gloo on the CPU), their sharded checkpoints, and the memory
planner checked against the tensors each rank really holds.

The jobs (tests/scripts/sharded_train.py) run when the module starts, each bounded by a timeout and dumping
stacks on a hang; one job does many fits because interpreter start-up dominates. Every fit trains the same
model on the same shuffled data with Adam, StepLR, accumulation 2, norm clipping and validation.
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from test_ddp_processes import Job, assert_same_weights, clean_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "sharded_train.py"
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(600),
]

spec = importlib.util.spec_from_file_location("sharded_train", SCRIPT)
sharded_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sharded_train)


def job(out: Path, *args: str) -> Job:
    out.mkdir()
    return Job(out, [([sys.executable, str(SCRIPT), "--out", str(out), *args], clean_env())])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Job]:
    tmp = tmp_path_factory.mktemp("sharded_jobs")
    first = {"strategies": job(tmp / "strategies", "--job", "strategies")}
    if HAS_DEEPSPEED:
        first["deepspeed"] = job(tmp / "deepspeed", "--job", "deepspeed")
    with concurrent.futures.ThreadPoolExecutor(len(first)) as pool:
        list(pool.map(Job.run, first.values()))
    epoch_end = tmp / "strategies" / "ckpt_fsdp" / "epochs" / "epoch=0-step=4.ckpt"
    first["world1"] = job(tmp / "world1", "--job", "world1", "--resume", str(epoch_end)).run()
    return first


@pytest.fixture(scope="module")
def ranks(jobs) -> list[dict]:
    reports = jobs["strategies"].check_ok()
    assert [r["rank"] for r in reports] == [0, 1]
    return reports


def assert_equal(a: dict, b: dict) -> None:
    assert_same_weights(a, b, atol=0)


# ---------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("name", ["zero1", "zero2", "fsdp"])
def test_sharded_strategies_train_like_ddp(ranks, name):
    for rank in ranks:
        assert rank[name]["global_step"] == rank["ddp"]["global_step"] == 8
        assert_same_weights(rank[name]["weights"], rank["ddp"]["weights"], atol=1e-5)
        assert rank[name]["val_loss"] == pytest.approx(rank["ddp"]["val_loss"], rel=1e-5)
    assert_equal(ranks[0][name]["weights"], ranks[1][name]["weights"])
    expected = "ZeroRedundancyOptimizer" if name == "zero1" else "Adam"
    assert ranks[0][name]["optimizer"] == expected


@pytest.mark.parametrize("name", ["zero1", "zero2", "fsdp"])
def test_each_rank_holds_about_half_of_the_optimizer_state(ranks, name):
    total = ranks[0]["ddp"]["bytes"]["optimizer_state"]  # DDP: every rank holds all of it
    shares = [rank[name]["bytes"]["optimizer_state"] / total for rank in ranks]
    assert all(0.4 <= share <= 0.6 for share in shares), shares
    for rank in ranks:
        params = rank[name]["bytes"]["parameters"] / rank["ddp"]["bytes"]["parameters"]
        assert params == 1.0 if name == "zero1" else 0.4 <= params <= 0.6  # ZeRO-1 keeps parameters whole


@pytest.mark.parametrize("name", STRATEGIES)
def test_memory_planner_equals_the_bytes_each_rank_holds(ranks, name):
    from trainer.memory import estimate

    plan = estimate(sharded_train.Net(), strategy=name, world_size=2, optimizer="adam", auto_wrap_policy={nn.Linear})
    for rank_index, rank in enumerate(ranks):
        planned = plan.devices[rank_index]
        measured = rank[name]["bytes"]
        assert (planned.parameters, planned.gradients, planned.optimizer_state) == (
            measured["parameters"], measured["gradients"], measured["optimizer_state"])  # fmt: skip


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("name", ["fsdp", "zero1"])
def test_sharded_checkpoint_resumes_exactly(jobs, ranks, name):
    folder = jobs["strategies"].out / f"ckpt_{name}" / f"epoch=0-step={sharded_train.STOP_AT}.ckpt"
    assert folder.is_dir()
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"} <= {p.name for p in folder.iterdir()}
    assert (folder.parent / "last.ckpt" / ".metadata").is_file()  # save_last of a folder is a folder too
    for rank in ranks:
        assert Path(rank[f"{name}_resumed_from"]).is_dir()  # ckpt_path="last" found a folder
        assert_equal(rank[f"{name}_resumed"], rank[name]["weights"])


def test_full_checkpoint_file_loads_into_a_sharded_run(ranks):
    for rank in ranks:
        assert_equal(rank["fsdp_from_full_file"], rank["fsdp"]["weights"])


def test_resume_from_inside_an_accumulation_window_is_exact(jobs, ranks):
    assert (jobs["strategies"].out / "mid_window.ckpt" / ".metadata").is_file()
    for rank in ranks:
        assert_equal(rank["fsdp_from_mid_window"], rank["fsdp"]["weights"])


def test_folder_written_by_fsdp_resumes_under_zero1(ranks):
    for rank in ranks:
        assert_same_weights(rank["zero1_from_fsdp_folder"], rank["zero1"]["weights"], atol=1e-5)


def test_consolidate_command_writes_one_weights_only_file(jobs, ranks, tmp_path):
    folder = jobs["strategies"].out / "ckpt_fsdp" / f"epoch=0-step={sharded_train.STOP_AT}.ckpt"
    out = tmp_path / "full.ckpt"
    proc = subprocess.run([sys.executable, "-m", "trainer", "checkpoint", "consolidate", str(folder), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=clean_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Wrote" in proc.stdout
    checkpoint = torch.load(out, weights_only=True)
    assert checkpoint["global_step"] == sharded_train.STOP_AT
    module = sharded_train.Net()
    module.load_state_dict(checkpoint["state_dict"])
    assert_equal(module.state_dict(), ranks[0]["fsdp_at_stop"])
    optimizer = torch.optim.Adam(module.parameters())
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])  # torch's index-keyed format again
    assert optimizer.state_dict()["param_groups"][0]["betas"] == (0.9, 0.999)
    assert set(optimizer.state_dict()["state"]) == set(range(len(list(module.parameters()))))


def test_two_rank_folder_resumes_in_one_fsdp_process(jobs, ranks):
    (report,) = jobs["world1"].check_ok()
    assert report["world_size"] == 1 and report["global_step"] == 8
    assert_same_weights(report["weights"], ranks[0]["fsdp"]["weights"], atol=1e-5)


def test_two_rank_folder_resumes_on_a_single_device(jobs, ranks):
    folder = jobs["strategies"].out / "ckpt_fsdp" / "epochs" / "epoch=0-step=4.ckpt"
    trainer, module = sharded_train.fit("single_device", devices=1, batch=2 * sharded_train.BATCH, ckpt_path=str(folder),
                                        one_process_order=True)
    assert trainer.global_step == 8
    assert_same_weights(module.state_dict(), ranks[0]["fsdp"]["weights"], atol=1e-5)


# ---------------------------------------------------------------------------------------------- deepspeed
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (optional: pip install '.[deepspeed]')")
def test_deepspeed_zero2_trains_like_ddp_and_resumes_exactly(jobs, ranks):
    reports = jobs["deepspeed"].check_ok()
    for report in reports:
        assert report["global_step"] == 8
        # DeepSpeed's ZeRO-2 steps Adam on flattened fp32 partitions and reduces gradients in buckets of its
        # own order: the same arithmetic up to float32 summation order, so 1e-5 as for FSDP.
        assert_same_weights(report["weights"], ranks[report["rank"]]["ddp"]["weights"], atol=1e-5)
        assert Path(report["resumed_from"]).is_dir()  # DeepSpeed's own checkpoint folder, found by "last"
        assert_equal(report["resumed"], report["weights"])
