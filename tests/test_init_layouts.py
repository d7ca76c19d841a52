"""The weights your code describes, on every layout: modules built in ``configure_model`` on ``meta`` start, at
every layout, from exactly the tensors the same script gives on one device, in every run.

Two jobs (tests/scripts/init_zoo.py), each run twice (separate processes: the runs must agree with each other as
well as with one device), while this process builds the one-device references:
4 ranks (fsdp=4, dp_shard=2 x tp=2, Lightning's ModelParallelStrategy(2, 2), dp_shard=2 x pp=2, a transformers
Llama at dp_shard=2 x tp=2) and 2 ranks (fsdp=2, zero2, pp=2, transformers Llama at fsdp and zero2 and GPT-2 at fsdp,
GPT-2 with each rank seeded differently, torchtitan's Llama-3 at pp=2, check_init).
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

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "init_zoo.py"

spec = importlib.util.spec_from_file_location("init_zoo", SCRIPT)
init_zoo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(init_zoo)

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(900),
]
needs_transformers = pytest.mark.skipif(not init_zoo.HAS_TRANSFORMERS,
                                        reason="transformers is not installed (the test extra installs it)")  # fmt: skip
needs_torchtitan = pytest.mark.skipif(not init_zoo.HAS_TORCHTITAN,
                                      reason="torchtitan is not installed (the test extra installs it)")  # fmt: skip

ZOO_LAYOUTS = [("four", "fsdp4"), ("four", "dp2_tp2"), ("four", "lightning_2x2"), ("four", "dp2_pp2"),
               ("two", "fsdp2"), ("two", "zero2"), ("two", "pp2")]  # fmt: skip
PIPELINED = {"dp2_pp2", "pp2"}  # the zoo without its tied weight (pipeline stages refuse one across them)
HF_LAYOUTS = [("four", "llama_dp2_tp2", "llama"), ("two", "llama_fsdp", "llama"), ("two", "llama_zero2", "llama"),
              ("two", "gpt2_fsdp", "gpt2")]  # fmt: skip

# construct -> the tensors it initialises (see Zoo in the script)
CONSTRUCTS = {
    "a seed set inside configure_model": ["model.wte.weight", "model.lm_head.weight"],
    "seed_everything inside configure_model": ["model.blocks.1.proj.bias"],
    "a torch.Generator handed to nn.init": ["model.blocks.0.fc.bias", "model.blocks.1.fc.bias"],
    "torch.random.fork_rng": ["model.norm.weight"],
    "Hugging Face's self.apply(self._init_weights)": ["model.blocks.0.fc.weight", "model.blocks.1.proj.weight"],
    "the root's init_weights() and its submodules' init_weights()": ["model.blocks.0.gate.scale",
                                                                     "model.blocks.1.gate.scale"],
    "trunc_normal_ on a tensor-parallel weight": ["model.blocks.0.proj.weight"],
    "buffers computed in __init__ and init_weights()": ["model.rope", "model.positions", "model.mask",
                                                        "model.offsets"],
    "a layer made in __init__ reused in configure_model": ["stem.weight", "stem.bias", "model.stem.weight"],
}


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("init_layouts")
    jobs = {}
    for name in ("four", "two"):
        for run in ("a", "b"):
            out = tmp / f"{name}_{run}"
            out.mkdir()
            jobs[(name, run)] = Job(out, [([sys.executable, str(SCRIPT), "--out", str(out), "--job", name],
                                           clean_env())], timeout_s=400)  # fmt: skip
    pool = concurrent.futures.ThreadPoolExecutor(len(jobs))
    yield {key: pool.submit(Job.run, job) for key, job in jobs.items()}
    pool.shutdown()


@pytest.fixture(scope="module")
def reference(started) -> dict:
    """One process, one device: the same modules built eagerly."""
    torch.set_num_threads(1)
    references = {"zoo": init_zoo.fit("auto", 1, init_zoo.Zoo)[1],
                  "pipelined_zoo": init_zoo.fit("auto", 1, init_zoo.pipelined_zoo)[1]}  # fmt: skip
    if init_zoo.HAS_TRANSFORMERS:
        for kind in ("llama", "gpt2"):
            references[kind] = init_zoo.fit("auto", 1, lambda kind=kind: init_zoo.HFModule(kind))[1]
        references["gpt2_seed_100"] = init_zoo.fit("auto", 1, lambda: init_zoo.HFModule("gpt2"), seed=100)[1]
    if init_zoo.HAS_TORCHTITAN:
        module, references["titan"], _ = init_zoo.fit("auto", 1, init_zoo.Titan, steps=3)
        references["titan_losses"] = module.losses
    return references


@pytest.fixture(scope="module")
def runs(started, reference) -> dict[str, list[list[dict]]]:
    """job name -> [run a's reports, run b's reports] (one report per rank)."""
    found: dict[str, list[list[dict]]] = {"four": [], "two": []}
    for (name, _), future in sorted(started.items()):
        found[name].append(future.result().check_ok())
    return found


def zoo_reference(reference: dict, layout: str) -> dict[str, torch.Tensor]:
    return reference["pipelined_zoo" if layout in PIPELINED else "zoo"]


@pytest.mark.parametrize("construct", list(CONSTRUCTS))
@pytest.mark.parametrize("job, layout", ZOO_LAYOUTS)
def test_each_construct_gives_the_one_device_tensors_at_every_layout_in_both_runs(runs, reference, job, layout,
                                                                                  construct):  # fmt: skip
    expected = zoo_reference(reference, layout)
    for run, reports in enumerate(runs[job]):
        weights = merged(reports, layout)
        for name in CONSTRUCTS[construct]:
            assert name in weights, f"{layout}: {name} missing"
            assert weights[name].dtype == expected[name].dtype and torch.equal(weights[name], expected[name]), (
                f"{construct}: {name} at {layout} (run {'ab'[run]}) differs from one device")


@pytest.mark.parametrize("job, layout", ZOO_LAYOUTS)
def test_every_tensor_of_the_zoo_is_the_one_device_build_and_was_replayed_not_rebuilt(runs, reference, job, layout):
    expected = zoo_reference(reference, layout)
    for reports in runs[job]:
        assert_bit_identical(merged(reports, layout), expected, layout)
        assert not reports[0][f"{layout}_fell_back"], f"{layout} needed the eager fallback"  # memory bound kept
    if layout not in PIPELINED:  # the tied weight: the same values under both names, as on one device
        assert "model.lm_head.weight" in expected and "model.wte.weight" in expected
        assert torch.equal(expected["model.lm_head.weight"], expected["model.wte.weight"])


def test_the_reference_is_the_codes_own_initialisation(reference):
    zoo = reference["zoo"]
    assert 0.015 < zoo["model.wte.weight"].std() < 0.025  # _init_weights' N(0, 0.02), after the seed
    assert zoo["model.blocks.0.proj.weight"].abs().max() <= 0.03  # init_weights' truncated normal
    assert ((zoo["model.blocks.0.gate.scale"] - 1).abs() <= 0.2).all()  # the gate's own init_weights
    assert zoo["model.rope"].dtype == torch.complex64
    assert torch.allclose(zoo["model.rope"].abs(), torch.full_like(zoo["model.rope"].abs(), 2.0))  # recomputed * 2


@needs_transformers
@pytest.mark.parametrize("job, layout, kind", HF_LAYOUTS)
def test_transformers_models_start_from_their_own_init_at_every_layout(runs, reference, job, layout, kind):
    expected = reference[kind]
    for reports in runs[job]:
        assert_bit_identical(merged(reports, layout), expected, layout)
        assert not reports[0][f"{layout}_fell_back"], f"{layout} needed the eager fallback"
    embedding = next(value for name, value in expected.items() if "embed_tokens" in name or "wte" in name)
    assert 0.015 < embedding.std() < 0.025  # the model's _init_weights, not nn.Embedding's N(0, 1)


@needs_transformers
def test_ranks_seeded_differently_still_build_one_model_rank_zeros(runs, reference):
    for reports in runs["two"]:
        assert_bit_identical(merged(reports, "gpt2_fsdp_seed_per_rank"), reference["gpt2_seed_100"], "seed per rank")


@needs_torchtitan
def test_torchtitan_llama3_under_pp2_is_finite_has_unit_rope_and_trains_like_one_process(runs, reference):
    for reports in runs["two"]:
        weights = merged(reports, "titan_pp2")
        assert_bit_identical(weights, reference["titan"], "titan pp=2")
        for report in reports:
            stage = report["titan_pp2"]
            assert all(torch.isfinite(t).all() for t in stage.values()), "a non-finite initial tensor"
            freqs = stage["model.freqs_cis"]  # every stage keeps the root's RoPE table
            assert freqs.dtype == torch.complex64 and torch.allclose(freqs.abs(), torch.ones_like(freqs.abs()))
            assert report["titan_pp2_losses"] == pytest.approx(reference["titan_losses"], abs=1e-5)


def test_check_init_passes_on_the_zoo_and_names_a_tensor_built_differently_on_meta(runs):
    for reports in runs["two"]:
        for report in reports:
            assert report["check_init_passed"]
            assert "check_init: model.norm.weight after deferred initialisation differs" in report["check_init_error"]
            assert ".is_meta" in report["check_init_error"]
