"""Hugging Face models trained as they are, exported and imported at any layout (tiny configs built here, no
download).

One 2-rank job (tests/scripts/hf_job.py, gloo on the CPU) trains a Llama-style and a GPT-2-style model under fsdp
and the Llama one at dp_shard=1 x tp=2, with no plan written by the module: the FSDP units come from the model's
``_no_split_modules``, the tensor-parallel plan from its own ``_tp_plan``. This process builds the one-device
references meanwhile.
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from layout_support import assert_bit_identical
from test_ddp_processes import Job, clean_env

pytest.importorskip("transformers", reason="transformers is not installed (the hf extra, installed by make test)")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "hf_job.py"

spec = importlib.util.spec_from_file_location("hf_job", SCRIPT)
hf_job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hf_job)

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed"),
    pytest.mark.timeout(400),
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_job")
    started = Job(out, [([sys.executable, str(SCRIPT), "--out", str(out), "--job", "train"], clean_env())],
                  timeout_s=300)  # fmt: skip
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(Job.run, started)
    yield future, out
    pool.shutdown()


@pytest.fixture(scope="module")
def reference(job) -> dict:
    """One process, one device: the same modules' initial weights and trained losses."""
    torch.set_num_threads(1)
    found = {}
    for kind in ("llama", "gpt2"):
        module = hf_job.CausalLM(kind)
        _, found[kind] = hf_job.fit("auto", module, devices=1)
    return found


@pytest.fixture(scope="module")
def reports(job, reference) -> list[dict]:
    future, _ = job
    return future.result().check_ok()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_transformers_model_trains_under_fsdp_with_its_blocks_as_units(reports, kind):
    for report in reports:
        losses = report[f"{kind}_fsdp_losses"]
        assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
        block = {"llama": "LlamaDecoderLayer", "gpt2": "GPT2Block"}[kind]
        assert report[f"{kind}_fsdp_units"] == [f"FSDP{block}"]  # _no_split_modules, not one unit for everything


def test_llama_trains_at_tp2_under_its_own_plan(reports):
    for report in reports:
        assert len(report["llama_tp2_losses"]) == 3 and all(torch.isfinite(torch.tensor(report["llama_tp2_losses"])))
        sharded = report["llama_tp2_sharded"]
        assert "model.model.layers.0.self_attn.q_proj.weight" in sharded and "model.lm_head.weight" in sharded
        assert "model.model.norm.weight" not in sharded
    assert reports[0]["llama_tp2_losses"] == reports[1]["llama_tp2_losses"]  # both tp ranks compute one model


def test_gpt2_at_tp2_says_it_has_no_plan_and_what_to_give(reports):
    for report in reports:
        message = report["gpt2_tp2_error"]
        assert message.startswith("ConfigurationError: tp > 1, but GPT2LMHeadModel carries no tensor-parallel plan")
        assert "tp_plan=" in message and "parallelize_module" in message


@pytest.mark.parametrize("layout, kind", [("llama_fsdp", "llama"), ("gpt2_fsdp", "gpt2"), ("llama_tp2", "llama")])
def test_initial_weights_at_every_layout_are_one_devices_bit_for_bit(reports, reference, layout, kind):
    for report in reports:
        assert_bit_identical(report[f"{layout}_initial"], reference[kind], layout)


def test_activation_checkpointing_auto_checkpoints_the_models_blocks_and_refuses_a_plain_module():
    from transformers import AutoModelForCausalLM

    from trainer.strategies.errors import ConfigurationError
    from trainer.strategies.speed.activation_checkpointing import CheckpointedForward, apply_activation_checkpointing

    model = AutoModelForCausalLM.from_config(hf_job.hf_config("llama"))
    blocks = apply_activation_checkpointing(model, "auto")
    assert [type(b).__name__ for b in blocks] == ["LlamaDecoderLayer"] * 2
    assert all(isinstance(b.__dict__["forward"], CheckpointedForward) for b in blocks)
    tokens = hf_job.probe()
    model(tokens).logits.sum().backward()  # the checkpointed blocks run forward and backward
    with pytest.raises(ConfigurationError, match="activation_checkpointing='auto' checkpoints the blocks"):
        apply_activation_checkpointing(torch.nn.Sequential(torch.nn.Linear(2, 2)), "auto")
