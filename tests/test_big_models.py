"""Big models, correct by default, with real processes (gloo on the CPU): a nanoGPT-style model built in
``configure_model`` (on ``meta`` under the sharded strategies) starts from the weights its own code gives on one
device, bit for bit, at every layout; pipeline parallel splits ``self.model = GPT(...)`` and keeps its root RoPE
buffer on every stage; loss parallel runs through ``TrainModule.backward_context()``.

Two jobs (tests/scripts/big_models.py) run side by side while this process computes the one-process reference:
4 ranks (FSDP over 4, dp_shard=2 × tp=2, Lightning's ModelParallelStrategy(2, 2), dp_shard=2 × pp=2) and 2 ranks
(FSDP over 2, tp=2, pp=2 with the default split, training at pp=2 and at tp=2 with and without loss parallel).
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from layout_support import assert_bit_identical, merged
from test_ddp_processes import Job, clean_env
from trainer.strategies import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "big_models.py"
ATOL = 1e-5

spec = importlib.util.spec_from_file_location("big_models", SCRIPT)
big_models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(big_models)

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(900),
]


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("big_models")
    jobs = {}
    for name in ("four", "two"):
        (tmp / name).mkdir()
        jobs[name] = Job(tmp / name, [([sys.executable, str(SCRIPT), "--out", str(tmp / name), "--job", name],
                                       clean_env())])  # fmt: skip
    pool = concurrent.futures.ThreadPoolExecutor(len(jobs))
    yield {name: pool.submit(Job.run, each) for name, each in jobs.items()}
    pool.shutdown()


@pytest.fixture(scope="module")
def reference(started) -> dict:
    """One process: the eagerly built model's weights, then the same training."""
    torch.set_num_threads(1)
    module, initial = big_models.fit("auto", 1, steps=big_models.STEPS)
    return {"initial": initial.weights, "losses": module.computed,
            "final": {n: p.detach().clone() for n, p in module.named_parameters()}}  # fmt: skip


@pytest.fixture(scope="module")
def titan_reference(started) -> dict:
    """One process, a module initialised by its init_weights() (torchtitan's convention)."""
    torch.set_num_threads(1)
    return big_models.fit("auto", 1, big_models.TitanStyleGPT())[1].weights


@pytest.fixture(scope="module")
def four(started, reference) -> list[dict]:
    return started["four"].result().check_ok()


@pytest.fixture(scope="module")
def two(started, reference) -> list[dict]:
    return started["two"].result().check_ok()


def test_the_reference_is_the_models_own_init(reference):
    initial = reference["initial"]
    # nanoGPT's init, not the layers' reset_parameters(): N(0, 0.02) embeddings, zero biases, ones in LayerNorm
    assert 0.015 < initial["model.wte.weight"].std() < 0.025
    assert torch.equal(initial["model.layers.0.fc.bias"], torch.zeros(4 * big_models.DIM))
    assert torch.equal(initial["model.ln_f.weight"], torch.ones(big_models.DIM))
    assert initial["model.layers.0.proj.weight"].std() < 0.015  # the scaled projection init
    assert "model.rope" in initial  # the RoPE buffer, computed in __init__


@pytest.mark.parametrize("layout", ["fsdp4", "dp2_tp2", "lightning_2x2", "dp2_pp2"])
def test_four_rank_layouts_start_from_one_devices_weights_bit_for_bit(four, reference, layout):
    assert_bit_identical(merged(four, layout), reference["initial"], layout)


@pytest.mark.parametrize("layout", ["fsdp2", "tp2", "pp2"])
def test_two_rank_layouts_start_from_one_devices_weights_bit_for_bit(two, reference, layout):
    assert_bit_identical(merged(two, layout), reference["initial"], layout)


@pytest.mark.parametrize("job, layout", [("four", "init_weights_tp2_pp2"), ("two", "init_weights_fsdp2")])
def test_init_weights_gives_the_same_model_at_every_layout(four, two, titan_reference, job, layout):
    reports = {"four": four, "two": two}[job]
    assert_bit_identical(merged(reports, layout), titan_reference, layout)
    assert titan_reference["model.layers.0.fc.weight"].abs().max() <= 0.04  # init_weights' truncated normal


def test_pipeline_splits_self_model_keeps_the_root_buffer_on_every_stage_and_trains_like_one_process(two, reference):
    stages = [set(report["pp2"]) for report in two]
    assert all("model.rope" in names for names in stages)  # the buffer every block reads, on both stages
    assert "model.wte.weight" in stages[0] and "model.lm_head.weight" in stages[1]  # split inside self.model
    for report in two:
        assert report["pp2_losses"] == pytest.approx(reference["losses"], abs=ATOL)
    final = {name: value for report in two for name, value in report["pp2_final"].items()}
    assert sorted(final) == sorted(reference["final"])
    for name, value in reference["final"].items():
        torch.testing.assert_close(final[name], value, rtol=0, atol=ATOL, msg=lambda m: f"{name}: {m}")


def test_loss_parallel_trains_like_tensor_parallel_without_it_and_logs_the_computed_loss(two, reference):
    for report in two:
        assert report["loss_parallel_computed"] == pytest.approx(report["tp2_losses"], abs=ATOL)
        assert report["loss_parallel_logged"] == pytest.approx(report["loss_parallel_computed"], abs=1e-6)
        assert len(report["loss_parallel_logged"]) == big_models.STEPS
        for name, value in report["tp2_final"].items():
            torch.testing.assert_close(report["loss_parallel_final"][name], value, rtol=0, atol=ATOL)
    assert two[0]["tp2_losses"] == pytest.approx(reference["losses"], abs=ATOL)


# ---------------------------------------------------------------------------------------------- in one process
def test_split_points_may_name_nested_modules_and_parameters_on_an_expanded_module_are_refused():
    from torch import nn

    from trainer.strategies.nd.pipeline import split_units

    module = big_models.GPTModule(split_points=["model.layers.1"])
    module.configure_model()
    units, stages = split_units(module, 2)
    assert [name for name, _, _ in units] == ["model.wte", "model.layers.0", "model.layers.1", "model.ln_f",
                                              "model.lm_head"]  # fmt: skip
    assert stages == [0, 0, 1, 1, 1]
    module.model.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(ConfigurationError, match=r"'model' holds parameters \['scale'\] directly"):
        split_units(module, 2)


def test_tied_weights_across_stages_are_refused_with_the_reason():
    from trainer.strategies.nd.pipeline import keep_stage

    module = big_models.GPTModule(split_points=["model.layers.1"])
    module.configure_model()
    module.model.lm_head.weight = module.model.wte.weight
    with pytest.raises(ConfigurationError, match="tied weights"):
        keep_stage(module, 0, 2)


def test_an_init_that_cannot_be_replayed_is_refused_with_the_reason():
    from trainer.strategies.precision.plugins import Precision
    from trainer.strategies.speed.deferred_init import materialize, module_init_context

    outside = torch.empty(4, device="meta")  # a meta tensor from outside the recorded build

    class Copies(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(4))
            with torch.no_grad():
                self.weight.copy_(outside)

    with module_init_context(torch.device("cpu"), Precision(), None, meta=True):
        module = Copies()
    with pytest.raises(ConfigurationError, match="cannot be replayed.*not built while recording"):
        materialize(module, torch.device("cpu"))



class Stack(torch.nn.Module):
    """Layers initialised twice (their reset_parameters, then the model's own _init_weights), as nanoGPT does."""

    def __init__(self, layers: int = 8, width: int = 64) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
        self.apply(self._init_weights)

    def _init_weights(self, module: torch.nn.Module) -> None:
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.02)
            torch.nn.init.zeros_(module.bias)


def test_the_replay_holds_about_one_full_parameter_and_follows_a_conversion_after_the_build():
    from trainer.strategies.precision.plugins import Precision
    from trainer.strategies.speed.deferred_init import materialize, module_init_context
    from trainer.strategies.speed.init_recording import origins_of

    torch.manual_seed(0)
    eager = Stack().to(torch.float64)
    torch.manual_seed(0)
    with module_init_context(torch.device("cpu"), Precision(), None, meta=True):
        module = Stack()
    module.to(torch.float64)  # e.g. the precision's conversion, after the build
    recording = next(iter(origins_of(module).values()))[0]
    materialize(module, torch.device("cpu"))
    for name, value in eager.state_dict().items():
        assert module.state_dict()[name].dtype == torch.float64 and torch.equal(module.state_dict()[name], value), name
    weight = 64 * 64 * 4
    assert weight <= recording.replay_peak_bytes <= 2 * weight  # not the 8 layers' 8 weights


class Assorted(torch.nn.Module):
    """Initialisation written every way model code writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(5) * 2)  # a random factory and arithmetic
        self.register_buffer("offsets", torch.zeros(3).add_(1))  # a computed buffer
        self.embed = torch.nn.Embedding(6, 4, padding_idx=0)
        self.embed.weight.data[1:3].normal_(std=0.5)  # a partial in-place draw through .data
        self.linear = torch.nn.Linear(4, 4)
        with torch.no_grad():
            self.linear.bias[0] = 5.0  # __setitem__
        # nn.init functions that skip meta tensors and draw by value (rejection sampling, a QR)
        torch.nn.init.trunc_normal_(self.linear.weight, std=0.5, a=-0.6, b=0.6)
        self.rotation = torch.nn.Parameter(torch.empty(4, 4))
        torch.nn.init.orthogonal_(self.rotation)


def test_partial_writes_random_factories_and_computed_buffers_replay_exactly():
    from trainer.strategies.precision.plugins import Precision
    from trainer.strategies.speed.deferred_init import materialize, module_init_context

    torch.manual_seed(0)
    eager, after_eager = Assorted(), torch.randn(2)
    torch.manual_seed(0)
    with module_init_context(torch.device("cpu"), Precision(), None, meta=True):
        module = Assorted()
    assert module.scale.is_meta
    materialize(module, torch.device("cpu"))
    assert torch.equal(torch.randn(2), after_eager)  # the generator continues as after the eager build
    for name, value in eager.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name
