"""N-D parallelism on one device mesh (FSDP2 × tensor parallel × pipeline parallel), deferred initialisation and
checkpoints across layouts, with real processes (gloo on the CPU).

Three jobs (tests/scripts/mesh_train.py) start with the module, side by side, each bounded by a timeout and
dumping stacks on a hang: 4 ranks (FSDP2×TP, (dp_shard=2, pp=2), Lightning's ModelParallelStrategy, resumes at
dp_shard=4 and (tp=2, pp=2)), 2 ranks (TP, PP with GPipe and 1F1B) and 2 ranks measuring memory. Every training
fit is compared with the same recipe run in this process.

Tolerance: 1e-5 on weights and losses. Tensor parallel's row-wise layers sum partial products across ranks and
FSDP averages gradients with a reduce-scatter, so float32 sums run in another order than in one process (about
1e-7 relative per step); after six SGD steps the weights agree within 1e-5 (seen: 6e-8). (With Adam a
parameter whose gradient is only rounding noise, such as an attention key bias, moves by whole steps in a random
direction; the test model has none.)
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

from trainer.strategies import ConfigurationError, ModelParallelStrategy, NDParallelStrategy
from trainer.strategies.nd.mesh import MeshLayout, resolve_layout
from trainer.strategies.checkpoint.sharded_checkpoint import load_full
from test_ddp_processes import Job, clean_env
from trainer import Trainer, TrainModule

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "mesh_train.py"
ATOL = 1e-5

spec = importlib.util.spec_from_file_location("mesh_train", SCRIPT)
mesh_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mesh_train)

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(600),
]


def job(out: Path, name: str, **env: str) -> Job:
    out.mkdir()
    return Job(out, [([sys.executable, str(SCRIPT), "--out", str(out), "--job", name], clean_env(**env))])


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """The jobs, running in threads while this process computes the reference."""
    tmp = tmp_path_factory.mktemp("mesh_jobs")
    # A fixed mmap threshold makes glibc return freed large blocks to the system, so the resident-set peak
    # measures what is alive rather than what the allocator kept after freeing.
    defined = {"four": job(tmp / "four", "four"), "two": job(tmp / "two", "two"),
               "memory": job(tmp / "memory", "memory", MALLOC_MMAP_THRESHOLD_="131072")}  # fmt: skip
    pool = concurrent.futures.ThreadPoolExecutor(len(defined))
    yield {name: pool.submit(Job.run, each) for name, each in defined.items()}
    pool.shutdown()


@pytest.fixture(scope="module")
def jobs(started, reference) -> dict[str, Job]:
    return {name: future.result() for name, future in started.items()}


@pytest.fixture(scope="module")
def four(jobs) -> list[dict]:
    return jobs["four"].check_ok()


@pytest.fixture(scope="module")
def two(jobs) -> list[dict]:
    return jobs["two"].check_ok()


@pytest.fixture(scope="module")
def reference(started) -> dict:
    """The recipe in one process: per-batch losses, final weights, validation loss, parameter bytes."""
    torch.set_num_threads(1)
    trainer, module = mesh_train.reference_fit()
    return {"losses": module.step_losses, "weights": {k: v.clone() for k, v in module.state_dict().items()},
            "val_loss": float(trainer.callback_metrics["val_loss"]),
            "parameter_bytes": mesh_train.local_parameter_bytes(module)}  # fmt: skip


def mean_losses(reports: list[dict], name: str, dp_ranks: list[int]) -> list[float]:
    """The loss of each batch over the whole data-parallel batch (each rank logs its own slice's)."""
    per_rank = [reports[rank][name]["losses"] for rank in dp_ranks]
    return [sum(values) / len(values) for values in zip(*per_rank)]


def assert_weights(folder: Path, expected: dict) -> None:
    state = load_full(folder)["state_dict"]
    assert sorted(state) == sorted(expected)
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=ATOL, msg=lambda m: f"{name}: {m}")


# (report name, job, ranks holding different data-parallel slices, shard × tp × pp)
LAYOUTS = [("fsdp_tp", "four", [0, 2], 4), ("fsdp_pp", "four", [0, 1], 4), ("lightning", "four", [0, 2], 4),
           ("hsdp", "four", [0, 1, 2, 3], 2),
           ("tp", "two", [0], 2), ("pp_gpipe", "two", [0], 2), ("pp_1f1b", "two", [0], 2)]  # fmt: skip


# ---------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("name, job_name, dp_ranks, split", LAYOUTS)
def test_every_layout_trains_like_one_process(jobs, reference, name, job_name, dp_ranks, split):
    reports = jobs[job_name].check_ok()
    for report in reports:
        assert report[name]["global_step"] == 6
    assert mean_losses(reports, name, dp_ranks) == pytest.approx(reference["losses"], abs=ATOL)
    assert_weights(jobs[job_name].out / f"{name}.ckpt", reference["weights"])


@pytest.mark.parametrize("name, job_name, dp_ranks, split", LAYOUTS)
def test_each_rank_holds_its_share_of_the_parameters(jobs, reference, name, job_name, dp_ranks, split):
    share = reference["parameter_bytes"] / split
    for report in jobs[job_name].check_ok():
        # Exactly 1/split, except for the layer norms, which tensor parallel replicates.
        assert 0.98 * share <= report[name]["parameter_bytes"] <= 1.05 * share, (report["rank"], share)


def test_pipeline_loss_reaches_every_rank_once_per_batch(four, two):
    assert two[0]["pp_gpipe"]["losses"] == two[1]["pp_gpipe"]["losses"]  # from the last stage, broadcast
    assert len(two[0]["pp_gpipe"]["losses"]) == 12  # one per batch, not one per micro-batch
    assert [r["fsdp_pp"]["losses"] for r in four[:2]] == [r["fsdp_pp"]["losses"] for r in four[2:]]  # stage 0 == 1


def test_pipeline_stages_come_from_the_planner_without_split_points(two):
    first, last = (set(r["pp_1f1b"]["stage_parameters"]) for r in two)
    assert {"embed.weight", "layers.1.down.bias"} <= first and not first & last
    assert {"layers.2.q.weight", "head.weight", "norm.bias"} <= last


def test_validation_runs_through_the_pipeline(four, reference):
    for report in four:
        assert report["fsdp_pp"]["val_loss"] == pytest.approx(reference["val_loss"], abs=ATOL)


def test_lightning_model_parallel_script_runs_with_its_mesh_names(four):
    assert four[0]["lightning"]["dims"] == ("data_parallel", "tensor_parallel")


def test_a_batch_that_does_not_split_into_micro_batches_is_refused(two):
    assert "microbatches=3" in two[0]["indivisible_batch_error"]


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("name, dp_ranks", [("resumed_dp4", [0, 1, 2, 3]), ("resumed_tp_pp", [0])])
def test_checkpoint_of_fsdp_tp_resumes_at_another_layout(jobs, four, reference, name, dp_ranks):
    batches_done = mesh_train.SAVE_AT * mesh_train.ACCUMULATE
    assert mean_losses(four, name, dp_ranks) == pytest.approx(reference["losses"][batches_done:], abs=ATOL)
    assert_weights(jobs["four"].out / f"{name}.ckpt", reference["weights"])


def test_pipeline_checkpoint_inside_an_accumulation_window_resumes_under_tp(jobs, two, reference):
    assert mean_losses(two, "tp_from_mid_window", [0]) == pytest.approx(reference["losses"][mesh_train.MID_WINDOW + 1:],
                                                                       abs=ATOL)  # fmt: skip
    assert_weights(jobs["two"].out / "tp_from_mid_window.ckpt", reference["weights"])


def test_checkpoint_of_fsdp_tp_resumes_in_one_process(jobs, four, reference):
    trainer, module = mesh_train.reference_fit(ckpt_path=jobs["four"].out / "fsdp_tp_at_2.ckpt")
    batches_done = mesh_train.SAVE_AT * mesh_train.ACCUMULATE
    assert module.step_losses == pytest.approx(reference["losses"][batches_done:], abs=ATOL)
    for key, value in reference["weights"].items():
        torch.testing.assert_close(module.state_dict()[key], value, rtol=0, atol=ATOL, msg=lambda m: f"{key}: {m}")


def test_consolidate_turns_a_pipeline_checkpoint_into_one_file(jobs, four, reference, tmp_path):
    out = tmp_path / "full.ckpt"
    subprocess.run([sys.executable, "-m", "trainer", "checkpoint", "consolidate", str(jobs["four"].out / "fsdp_pp.ckpt"),
                    str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120, env=clean_env())  # fmt: skip
    checkpoint = torch.load(out, weights_only=True)
    assert checkpoint["global_step"] == 6
    for key, value in reference["weights"].items():
        torch.testing.assert_close(checkpoint["state_dict"][key], value, rtol=0, atol=ATOL, msg=lambda m: f"{key}: {m}")
    optimizer = checkpoint["optimizer_states"][0]
    assert len(optimizer["state"]) == len(reference["weights"])  # both stages' momentum buffers, index-keyed
    module = mesh_train.TinyLM()
    module.configure_model()
    module.configure_optimizers().load_state_dict(optimizer)  # loads into one process's optimizer


# ---------------------------------------------------------------------------------------------- deferred init
def test_deferred_init_keeps_each_rank_far_below_the_full_model(jobs):
    for report in jobs["memory"].check_ok():
        # bf16-true on 2 ranks: the shards alone are a quarter of the fp32 model; nothing holds it whole.
        assert report["full_fp32"] >= 3 * report["growth"], report
        assert report["full_fp32"] >= 3 * report["resumed_growth"], report
        assert report["resumed_step"] == 4


class Counting(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.calls, self.meshes, self.layer = 0, [], None

    def configure_model(self) -> None:
        self.calls += 1
        self.meshes.append(self.device_mesh)
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("v", self.layer(batch[0]).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def small_trainer(**kwargs) -> Trainer:
    return Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, **kwargs)  # fmt: skip


def test_configure_model_runs_once_per_module_and_sees_no_mesh_on_one_device():
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    module = Counting()
    trainer = small_trainer(max_steps=2)
    trainer.fit(module, data, data)
    trained = module.layer.weight.detach().clone()
    trainer.validate(module, data, verbose=False)
    assert module.calls == 1 and module.meshes == [None]
    assert torch.equal(module.layer.weight, trained)  # validate kept the trained layer


def test_init_module_builds_in_the_precision_dtype_and_can_skip_init():
    with small_trainer(precision="bf16-true").init_module():
        layer = nn.Linear(4, 4)
    assert layer.weight.dtype == torch.bfloat16
    state = torch.get_rng_state()
    with small_trainer().init_module(empty_init=True):
        nn.Linear(64, 64)
    assert torch.equal(torch.get_rng_state(), state)  # no random init ran: the weights are left for a checkpoint


def test_init_module_builds_on_meta_under_a_sharded_strategy():
    trainer = small_trainer(devices=2, strategy="fsdp")
    with trainer.init_module():
        assert nn.Linear(2, 2).weight.is_meta
    with trainer.init_module(empty_init=False):
        assert not nn.Linear(2, 2).weight.is_meta


def test_meta_module_without_reset_parameters_is_refused_with_advice():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.value = nn.Parameter(torch.ones(1))

    class Module(Counting):
        def configure_model(self) -> None:
            with torch.device("meta"):
                self.layer, self.scale = nn.Linear(2, 1), Scale()

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    with pytest.raises(ConfigurationError, match=r"\['Scale'\].*reset_parameters"):
        small_trainer(max_steps=1).fit(Module(), data)


# ---------------------------------------------------------------------------------------------- layouts
def test_layout_sizes_are_resolved_against_the_world_size():
    assert resolve_layout(8, dp_shard="auto", tp=2) == MeshLayout(dp_shard=4, tp=2)
    assert resolve_layout(8, dp_replicate=2, dp_shard=2, tp=-1) == MeshLayout(dp_replicate=2, dp_shard=2, tp=2)
    layout = MeshLayout(dp_replicate=1, dp_shard=2, tp=2, pp=2)
    assert [layout.dp_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]  # TP peers share a batch
    assert layout.coordinates(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "tp": 1}


@pytest.mark.parametrize("sizes, message", [
    (dict(dp_shard=3, tp=2, pp="auto"), "dp_shard=3 × tp=2 = 6 does not divide the 4 processes"),
    (dict(dp_shard=2, tp=1), "dp_shard=2 = 2 does not match the 4 processes"),
    (dict(dp_shard="auto", tp="auto"), "at most one dimension can be 'auto'"),
    (dict(dp_shard=0), "dp_shard=0 must be a positive int"),
])  # fmt: skip
def test_bad_layouts_are_refused_with_the_arithmetic(sizes, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        small_trainer(devices=4, strategy=NDParallelStrategy(**sizes))


def test_pipeline_settings_are_checked_before_any_process_starts():
    with pytest.raises(ConfigurationError, match="microbatches=4 cuts batches for pipeline parallel; pp is 1"):
        small_trainer(devices=2, strategy=NDParallelStrategy(microbatches=4))
    with pytest.raises(ConfigurationError, match="precision='16-mixed'.*bf16-mixed"):
        small_trainer(devices=2, precision="16-mixed", strategy=NDParallelStrategy(dp_shard=1, pp=2))
    with pytest.raises(ConfigurationError, match="pipeline_schedule='zigzag'"):
        NDParallelStrategy(pipeline_schedule="zigzag")


def test_pipeline_stages_follow_split_points_and_keep_the_whole_models_names():
    from trainer.strategies.nd.pipeline import assign_stages, keep_stage, pipeline_units

    module = mesh_train.TinyLM(split_points=["layers.1", "norm"])
    module.configure_model()
    assert [name for name, _, _ in pipeline_units(module)] == ["embed", "layers.0", "layers.1", "layers.2", "layers.3",
                                                                "norm", "head"]  # fmt: skip
    assert assign_stages(module, 3) == [0, 0, 1, 1, 1, 2, 2]
    everything = keep_stage(module, 1, 3)
    assert len(everything) == len(mesh_train.TinyLM().state_dict()) or everything[0] == "embed.weight"
    assert module.embed is None and module.head is None and list(module.layers) == ["1", "2", "3"]
    assert next(iter(module.state_dict())).startswith("layers.1.")  # keys as in the whole model


@pytest.mark.parametrize("points, message", [(["layers.9"], "must name 1 unit"), (["embed"], "not the first unit")])
def test_bad_split_points_are_refused(points, message):
    from trainer.strategies.nd.pipeline import assign_stages

    module = mesh_train.TinyLM(split_points=points)
    module.configure_model()
    with pytest.raises(ConfigurationError, match=message):
        assign_stages(module, 2)


def test_pipeline_refuses_tied_weights_across_stages_and_a_module_without_its_loss():
    from trainer.strategies.nd.pipeline import PipelineRunner, keep_stage

    module = mesh_train.TinyLM()
    module.configure_model()
    module.head.weight = nn.Parameter(torch.zeros(mesh_train.VOCAB, mesh_train.DIM))
    module.embed.weight = module.head.weight
    with pytest.raises(ConfigurationError, match="tied weights"):
        keep_stage(module, 0, 2)
    with pytest.raises(ConfigurationError, match=r"define Linear.pipeline_loss\(output, target\)"):
        PipelineRunner(nn.Linear(1, 1), None, torch.device("cpu"), 2, "GPipe")


def test_model_parallel_strategy_takes_either_form_but_not_both():
    lightning = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size="auto")
    assert isinstance(lightning, ModelParallelStrategy) and isinstance(lightning, NDParallelStrategy)
    assert type(ModelParallelStrategy(device_map="auto")).__name__ == "ModelParallelStrategy"
    with pytest.raises(ConfigurationError, match="Use one form"):
        ModelParallelStrategy(tensor_parallel_size=2, device_map={"": 0})
    trainer = small_trainer(devices=4, num_nodes=1, strategy=ModelParallelStrategy(data_parallel_size=2))
    assert trainer.strategy.layout == MeshLayout(dp_shard=2, tp=2)
    assert type(small_trainer(devices=4, strategy="nd_parallel").strategy) is NDParallelStrategy


# ---------------------------------------------------------------------------------------------- CUDA
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run by make gpu-check)")


class TensorParallelOnOne(mesh_train.TinyLM):
    """Applies its tensor-parallel plan even on a mesh of one GPU (the parameters become DTensors)."""

    def configure_model(self) -> None:
        super().configure_model()
        mesh_train.apply_tensor_parallel(self, self.device_mesh["tp"])


def cuda_fit(strategy, module: TrainModule) -> TrainModule:
    trainer = Trainer(accelerator="cuda", devices=1, strategy=strategy, max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(module, torch.utils.data.DataLoader(mesh_train.dataset(), batch_size=mesh_train.BATCH))
    return module


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_fsdp_and_tensor_parallel_on_one_gpu_train_like_a_plain_run(strategy):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    expected = cuda_fit("auto", mesh_train.TinyLM())
    if strategy == "fsdp":
        module = cuda_fit("fsdp", mesh_train.TinyLM())
    else:
        module = cuda_fit(NDParallelStrategy(dp_shard=1, tp=1), TensorParallelOnOne())
    assert all(p.device.type == "cuda" for p in module.parameters())
    assert type(module.layers["0"].q.weight).__name__ == "DTensor"  # sharded (FSDP) or split (TP) over one GPU
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    for key, value in expected.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-4, msg=lambda m: f"{key}: {m}")  # TF32/cuBLAS sum orders


@pytest.mark.cuda
@needs_cuda
def test_meta_init_materialises_on_the_gpu():
    trainer = Trainer(accelerator="cuda", devices=1, strategy="fsdp", max_steps=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    module = Counting()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    with trainer.init_module():
        assert nn.Linear(1, 1).weight.is_meta
    trainer.fit(module, data)
    assert module.meshes[0] is not None
    weight = module.layer.weight
    assert weight.device.type == "cuda" and torch.isfinite(weight.full_tensor()).all()
