"""``trainer plan``: the job's own strategy set-up on torch's fake process group, one step on fake tensors.

Held to reality: tests/scripts/plan_lm.py runs the same jobs on 4 real gloo ranks (one job) (the same strategy code,
real tensors, one real step) and measures them the way the plan does; the planned parameter, gradient and
optimizer bytes and every collective (kind, mesh dimension, bytes) must be equal, the peak within 10%. Then the
refusals the command makes before any launch (exit status 2, one message naming the constraint), and the JSON.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_ddp_processes import clean_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
MODULE = f"{SCRIPTS / 'plan_lm.py'}:make_module"
REAL_TIMEOUT_S = 150

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
sys.path.insert(0, str(SCRIPTS))
import plan_lm  # noqa: E402


def real_run(tmp_path: Path, world: int, specs: list[str]) -> Path:
    out = tmp_path / f"real{world}"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               str(SCRIPTS / "plan_lm.py"), "--out", str(out), "--specs", ",".join(specs)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=REAL_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out


def assert_plan_matches(out: Path, name: str, world: int, peak_checked: bool = True, steps: bool = True,
                        both_ends: bool = False) -> None:
    """The plan of job ``name`` (its roles' first ranks, and last with ``both_ends``) against the real ranks'."""
    from trainer.plan.hardware import load_profile
    from trainer.plan.planner import plan_job

    plan = plan_job(plan_lm.job(name, world), load_profile("h100"), both_ends=both_ends)
    planned_ranks = [result for role in plan.roles for result in role.results]
    assert 0 in {r.rank for r in planned_ranks} and (not both_ends or world - 1 in {r.rank for r in planned_ranks})
    for result in planned_ranks:
        real = json.loads((out / f"{name}-rank{result.rank}.json").read_text())
        where = f"{name} at {world} ranks, rank {result.rank}"
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert result.held[key] == real[key], f"{where}: {key}"
        if not steps:
            continue
        assert [c.as_dict() for c in result.step.collectives] == real["collectives"], where
        if peak_checked:
            assert abs(result.step.peak_bytes - real["peak_bytes"]) <= 0.1 * real["peak_bytes"], where


@pytest.mark.timeout(REAL_TIMEOUT_S + 150)
def test_plan_equals_a_real_four_rank_run(tmp_path):
    """One real 4-rank job carries every layout (torchrun and the workers' imports are paid once): FSDP and ZeRO-2
    at 4 ranks show what they show at 2, dp_shard=2 × tp=2 holds tp's collectives and its peak under FSDP."""
    out = real_run(tmp_path, 4, ["nd_tp", "pp", "fsdp", "zero2"])
    assert_plan_matches(out, "nd_tp", 4, both_ends=True)  # dp_shard=2 × tp=2
    assert_plan_matches(out, "fsdp", 4, both_ends=True)
    assert_plan_matches(out, "zero2", 4)
    # dp_shard=2 × pp=2: each stage's cut and shards, held bytes exact; the schedule's step is not planned (a fake
    # process group cannot carry activations between stages), so its collectives and peak are not compared.
    assert_plan_matches(out, "pp", 4, steps=False, both_ends=True)


def plan_cli(capsys, *args: str) -> tuple[int, str, str]:
    """``trainer plan`` in this process (its fake ranks run in forked children): (status, stdout, stderr)."""
    from trainer.cli import main

    status = main(["plan", MODULE, "--micro-batch-size", "2", "--seq-len", "16", *args])
    out, err = capsys.readouterr()
    return status, out, err


def one_error(done: tuple[int, str, str]) -> str:
    status, out, err = done
    assert status == 2, out + err
    lines = [line for line in err.splitlines() if line.startswith("trainer plan: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.timeout(150)
def test_refusals_before_launch_exit_2_naming_the_constraint(capsys):
    heads = one_error(plan_cli(capsys, "--world-size", "3", "--strategy", "nd_parallel", "--tp", "3"))
    assert "--tp 3 does not divide the 4 attention heads" in heads and "tensor-parallel rank" in heads
    layers = one_error(plan_cli(capsys, "--world-size", "4", "--strategy", "nd_parallel", "--pp", "4", "--dp-shard", "1"))
    assert "--pp 4 is more than the 2 layers" in layers and "pipeline stage" in layers
    world = one_error(plan_cli(capsys, "--nodes", "2", "--devices-per-node", "4", "--world-size", "4"))
    assert "--world-size 4 is not --nodes 2 × --devices-per-node 4 = 8" in world
    batch = one_error(plan_cli(capsys, "--world-size", "2", "--global-batch-size", "6"))
    assert "--global-batch-size 6 is not a multiple of the 2 data-parallel ranks × --micro-batch-size 2" in batch


@pytest.mark.timeout(150)
def test_over_budget_names_the_role_the_biggest_holder_and_layouts_that_fit(capsys):
    over = one_error(plan_cli(capsys, "--world-size", "2", "--device-memory", "200KB"))
    assert "all ranks (ranks 0-1): the step's peak is" in over and "over the" in over
    assert "the biggest holder is" in over and ("Layouts that" in over or "No layout" in over)


@pytest.mark.timeout(150)
def test_json_has_one_entry_per_rank_role_with_the_figures(capsys):
    status, out, err = plan_cli(capsys, "--world-size", "4", "--strategy", "nd_parallel", "--tp", "2", "--precision",
                                "bf16-mixed", "--hardware", "h200", "--json")  # fmt: skip
    assert status == 0, err
    plan = json.loads(out)
    assert plan["world_size"] == 4 and len(plan["roles"]) == 1 and plan["roles"][0]["ranks"] == [0, 1, 2, 3]
    role = plan["roles"][0]
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes", "peak_bytes"):
        assert isinstance(role[key], int) and role[key] > 0, key
    assert {c["mesh_dim"] for c in role["collectives"]} == {"dp_shard", "tp"}
    assert all(set(c) >= {"op", "mesh_dim", "bytes"} for c in role["collectives"])
    assert plan["step_time_s"]["compute"] > 0 and plan["step_time_s"]["communication"] > 0
    assert 0 < plan["mfu"]["worst"] <= plan["mfu"]["best"] <= 1 and plan["tokens_per_s"]["best"] > 0


@pytest.mark.timeout(150)
def test_compare_sweeps_then_reports_the_fake_rank_plan_of_the_recommendation(capsys):
    """One planner: the arithmetic sweeps every strategy, the recommended one's figures are its plan_job's."""
    from trainer.plan.hardware import load_profile
    from trainer.plan.planner import human_bytes, plan_job

    status, out, err = plan_cli(capsys, "--world-size", "2", "--compare", "--device-memory", "80GB")
    assert status == 0, err
    assert "First pass (arithmetic)" in out and all(name in out for name in ("ddp", "zero1", "zero2", "fsdp"))
    spec = plan_lm.job("fsdp", 2)
    spec = type(spec)(**{**spec.__dict__, "strategy": "nd_parallel", "dp_replicate": 2, "dp_shard": 1})
    peak = max(r.step.peak_bytes for role in plan_job(spec, load_profile("h100")).roles for r in role.results)
    assert f"Use ddp: its plan on fake ranks peaks at {human_bytes(peak)} of 80.00 GiB" in out, out
    assert "nd_parallel [dp_replicate=2]" in out
    assert "drop --json" in one_error(plan_cli(capsys, "--world-size", "2", "--compare", "--json"))
    assert "trainer estimate-memory MODULE" in one_error(plan_cli(capsys, "--world-size", "2", "--compare", "--tp", "2"))


def test_import_trainer_imports_nothing_of_the_planner():
    code = "import sys, trainer; print(sorted(m for m in sys.modules if m.startswith('trainer.plan')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_slurm_submit_plans_first_and_refuses_without_writing_or_submitting(capsys, tmp_path, monkeypatch):
    """Where no SLURM runs (tests/slurm/test_slurm_plan.py checks the queue on a real cluster): the refusal comes
    before the script is written or ``sbatch`` is looked for."""
    from trainer.cli import main

    monkeypatch.chdir(tmp_path)
    status = main(["slurm", str(SCRIPTS / "report.py"), "--accelerator", "cpu", "--devices-per-node", "3", "--submit",
                   "--plan", MODULE, "--plan-args", "--strategy nd_parallel --tp 3 --micro-batch-size 2 --seq-len 16"])
    err = capsys.readouterr().err
    assert status == 2 and "the plan refuses this job, so nothing was submitted" in err, err
    assert not list(tmp_path.glob("*.sbatch"))


def test_a_transformers_model_is_refused_by_its_config_heads(capsys, tmp_path):
    pytest.importorskip("transformers", reason="the Hugging Face check needs transformers (pip install .[hf])")
    from trainer.cli import main

    source = tmp_path / "hf.py"
    source.write_text(
        "import torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n\n"
        "def make_model():\n"
        "    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,\n"
        "                         num_attention_heads=4, num_key_value_heads=2)\n"
        "    model = LlamaForCausalLM(config)\n"
        "    model.example_input_array = torch.zeros(2, 16, dtype=torch.long)\n"
        "    return model\n"
    )
    status = main(["plan", f"{source}:make_model", "--world-size", "3", "--strategy", "nd_parallel", "--tp", "3",
                   "--tp-plan", "megatron"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and "--tp 3 does not divide the 4 attention heads (num_attention_heads)" in err, err


def test_a_process_that_already_has_a_process_group_is_told_to_plan_without_one(tmp_path):
    """A notebook that fitted in-process keeps its group; planning there would fork ranks that inherit it."""
    from trainer.plan.hardware import load_profile
    from trainer.plan.planner import plan_job

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match=r"needs a process without a torch.distributed process group.*"
                                               r"rank 0 of 1.*destroy_process_group"):
            plan_job(plan_lm.job("fsdp", 2), load_profile("h100"))
    finally:
        torch.distributed.destroy_process_group()
