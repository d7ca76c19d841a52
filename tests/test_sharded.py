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
    expected = "ShardedOptimizer" if name == "zero1" else "Adam"
    assert ranks[0][name]["optimizer"] == expected


def test_fsdp_mixed_precision_follows_the_precision_plugin(ranks):
    for rank in ranks:
        assert rank["fsdp_bf16"]["compute_dtype"] == torch.bfloat16  # gathered for compute in bf16
        assert rank["fsdp_bf16"]["stored_dtypes"] == {torch.float32}  # the shards stay float32 master weights
    assert_equal(ranks[0]["fsdp_bf16"]["weights"], ranks[1]["fsdp_bf16"]["weights"])


def test_optimizer_built_before_sharding_is_refused_with_advice(ranks):
    for rank in ranks:
        assert "build the optimizer in configure_optimizers()" in rank["early_optimizer_error"]


@pytest.mark.parametrize("name", ["zero1", "zero2", "fsdp"])
def test_each_rank_holds_about_half_of_the_optimizer_state(ranks, name):
    total = ranks[0]["ddp"]["bytes"]["optimizer_state"]  # DDP: every rank holds all of it
    shares = [rank[name]["bytes"]["optimizer_state"] / total for rank in ranks]
    assert all(0.4 <= share <= 0.6 for share in shares), shares
    for rank in ranks:
        params = rank[name]["bytes"]["parameters"] / rank["ddp"]["bytes"]["parameters"]
        assert params == 1.0 if name == "zero1" else 0.4 <= params <= 0.6  # ZeRO-1 keeps parameters whole


def test_zero1_gives_every_rank_an_even_share_of_the_optimizer_state(ranks):
    # 8 -> 256 -> 256 -> 4 with Adam: whole-parameter partitions (ZeroRedundancyOptimizer) left one rank 95%.
    total = ranks[0]["ddp_wide"]["bytes"]["optimizer_state"]
    assert total == 69_124 * 8 + 6 * 4  # two float32 moments per parameter, one float32 step per tensor
    for rank in ranks:
        share = rank["zero1_wide"]["bytes"]["optimizer_state"] / (total / 2)
        assert 0.9 <= share <= 1.1, share
        assert rank["zero1_wide"]["bytes"]["parameters"] == rank["ddp_wide"]["bytes"]["parameters"]
        assert_same_weights(rank["zero1_wide"]["weights"], rank["ddp_wide"]["weights"], atol=1e-6)


def test_memory_planner_equals_zero1_shares_on_the_wide_model(ranks):
    from trainer.memory.planner import estimate

    plan = estimate(sharded_train.WideMLP(), strategy="zero1", world_size=2, optimizer="adam")
    for planned, rank in zip(plan.devices, ranks):
        measured = rank["zero1_wide"]["bytes"]
        assert (planned.parameters, planned.gradients, planned.optimizer_state) == (
            measured["parameters"], measured["gradients"], measured["optimizer_state"])  # fmt: skip


@pytest.mark.parametrize("name", STRATEGIES)
def test_memory_planner_equals_the_bytes_each_rank_holds(ranks, name):
    from trainer.memory.planner import estimate

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


def test_zero1_full_checkpoint_gathers_the_state_that_a_folder_consolidates_to(jobs, ranks, tmp_path):
    full_file = jobs["strategies"].out / "ckpt_zero1_full" / f"epoch=0-step={sharded_train.STOP_AT}.ckpt"
    assert full_file.is_file()  # one file written by rank 0
    for rank in ranks:
        assert_equal(rank["zero1_full_resumed"], rank["zero1"]["weights"])
    from trainer.strategies.checkpoint.sharded_checkpoint import consolidate

    folder = jobs["strategies"].out / "ckpt_zero1" / f"epoch=0-step={sharded_train.STOP_AT}.ckpt"
    consolidated = consolidate(folder, tmp_path / "zero1.ckpt")["optimizer_states"][0]
    gathered = torch.load(full_file, weights_only=True)["optimizer_states"][0]
    shapes = [p.shape for p in sharded_train.Net().parameters()]
    assert set(consolidated["state"]) == set(gathered["state"]) == set(range(len(shapes)))
    for index, entry in gathered["state"].items():
        assert entry["exp_avg"].shape == shapes[index]  # whole, not a rank's slice
        for key, value in entry.items():
            assert torch.equal(consolidated["state"][index][key], value), (index, key)


def test_an_optimizer_without_state_resumes_under_a_sharded_strategy(ranks):
    for report in ranks:
        assert_equal(report["zero2_sgd_resumed"], report["zero2_sgd_uninterrupted"])
        assert report["zero2_sgd_resumed_lr"] == sharded_train.LR * 0.5**2  # StepLR(3) after 8 steps, restored


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


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (optional: pip install '.[deepspeed]')")
@pytest.mark.parametrize("variant", ["offload", "zero3"])
def test_deepspeed_zero2_offload_and_zero3_on_cpu_ranks_train_like_ddp(jobs, ranks, variant):
    """ZeRO-2 with the optimizer in CPU memory, ZeRO-3 with optimizer and parameters offloaded, on 2 gloo ranks."""
    for report in jobs["deepspeed"].check_ok():
        run = report[variant]
        assert run["global_step"] == 8
        assert_same_weights(run["weights"], ranks[report["rank"]]["ddp"]["weights"], atol=1e-5)
    if variant == "offload":
        assert run["device"] == "cpu"
    else:
        total = sum(v.numel() for v in run["weights"].values())
        assert run["partitioned"] < total  # each rank holds only its partition of the parameters
        assert_same_weights(run["saved_weights"], run["weights"], atol=0)  # zero3_save_16bit_model: gathered weights


# ---------------------------------------------------------------------------------------------- misuse
def test_sharded_strategies_refuse_bad_settings_before_starting_processes():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from trainer.strategies import ConfigurationError, FSDPStrategy, Zero1Strategy, Zero2Strategy, ZeroStrategy
    from trainer import Trainer

    def trainer(strategy, **kwargs):
        return Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False, **kwargs)

    with pytest.raises(ConfigurationError, match=r"cpu_offload=True.*resolved to the CPU"):
        trainer(FSDPStrategy(cpu_offload=True))
    policy = MixedPrecisionPolicy(param_dtype=torch.float16)
    with pytest.raises(ConfigurationError, match=r"param_dtype=torch.float16 but precision='bf16-mixed'"):
        trainer(FSDPStrategy(mixed_precision=policy), precision="bf16-mixed")
    with pytest.raises(ConfigurationError, match="auto_wrap_policy='blocks'"):
        FSDPStrategy(auto_wrap_policy="blocks")
    with pytest.raises(ConfigurationError, match="state_dict_type='folder'"):
        FSDPStrategy(state_dict_type="folder")
    with pytest.raises(ConfigurationError, match="stage=3.*FSDPStrategy"):
        ZeroStrategy(stage=3)
    assert isinstance(ZeroStrategy(stage=1), Zero1Strategy) and isinstance(ZeroStrategy(), Zero1Strategy)
    zero2 = trainer("zero2").strategy
    assert isinstance(zero2, Zero2Strategy) and isinstance(zero2, ZeroStrategy) and isinstance(zero2, FSDPStrategy)
    assert zero2.reshard_after_forward is False


def test_zero1_refuses_optimizers_that_compute_over_whole_parameters():
    from trainer.strategies import ConfigurationError
    from trainer.strategies.data_parallel.sharded_optimizer import ShardedOptimizer

    for optimizer in (torch.optim.Adafactor, torch.optim.LBFGS):
        with pytest.raises(ConfigurationError, match=f"{optimizer.__name__} computes over whole parameters"):
            ShardedOptimizer(optimizer(nn.Linear(2, 2).parameters()), mesh=None)  # refused before any mesh is used


def test_wrap_policies_choose_units_bottom_up():
    from trainer.strategies.data_parallel.fsdp import wrap_targets

    net = sharded_train.Net()  # Linear(6,8): 56 parameters, Linear(8,6): 54, Linear(6,1): 7, scale: 1
    linears = [net.net[0], net.net[2], net.net[4]]
    assert wrap_targets(net, {nn.Linear}) == linears
    assert wrap_targets(net, 50) == linears[:2]  # the last Linear and the Sequential hold fewer than 50 left
    assert wrap_targets(net, 5) == linears
    assert wrap_targets(net, lambda module: module is net.net) == [net.net]


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (optional: pip install '.[deepspeed]')")
def test_deepspeed_settings_that_contradict_the_trainer_are_refused(tmp_path):
    from trainer.strategies import ConfigurationError
    from trainer.strategies.data_parallel.deepspeed import DeepSpeedStrategy
    from trainer import Trainer

    with pytest.raises(ConfigurationError, match=r"accumulate_grad_batches=4"):
        DeepSpeedStrategy(config={"gradient_accumulation_steps": 4}).build_config()
    with pytest.raises(ConfigurationError, match="offload_parameters needs stage=3"):
        DeepSpeedStrategy(stage=2, offload_parameters=True)
    with pytest.raises(ConfigurationError, match="needs nvme_path"):
        DeepSpeedStrategy(offload_optimizer="nvme")
    with pytest.raises(ConfigurationError, match="'optimizer'/'scheduler' section"):
        DeepSpeedStrategy(config={"optimizer": {"type": "AdamW"}}).build_config()
    on_cpu = Trainer(accelerator="cpu", devices=2, strategy=DeepSpeedStrategy(offload_optimizer=True), logger=False)
    config = on_cpu.strategy.build_config()  # the torch optimizer steps on the CPU already: no DeepSpeedCPUAdam needed
    assert config["zero_force_ds_cpu_optimizer"] is False and config["zero_optimization"]["offload_optimizer"] == {
        "device": "cpu", "pin_memory": False}  # fmt: skip
    auto = DeepSpeedStrategy(config={"train_batch_size": "auto", "zero_optimization": {"reduce_bucket_size": "auto"}})
    assert "reduce_bucket_size" not in auto.build_config()["zero_optimization"]  # Accelerate's "auto": DeepSpeed's default
    with pytest.raises(ConfigurationError, match="no such JSON file"):
        DeepSpeedStrategy(config=str(tmp_path / "missing.json"))
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0}')
    config = DeepSpeedStrategy(stage=3, config=tmp_path / "ds.json").build_config()
    assert config["zero_optimization"]["stage"] == 3 and config["gradient_clipping"] == 1.0
