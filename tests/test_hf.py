"""Hugging Face models trained as they are, exported and imported at any layout (tiny configs built here, no
download).

One 2-rank job (tests/scripts/hf_job.py, gloo on the CPU) trains a Llama-style and a GPT-2-style model under fsdp
and the Llama one at dp_shard=1 x tp=2, with no plan written by the module: the FSDP units come from the model's
``_no_split_modules``, the tensor-parallel plan from its own ``_tp_plan``. This process builds the one-device
references meanwhile.
"""
from __future__ import annotations

import concurrent.futures
import json
import subprocess
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


FROM_PRETRAINED = """
import sys, torch
from transformers import AutoModelForCausalLM
assert "trainer" not in sys.modules
out = {}
for name in sys.argv[2:]:
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1] + "/" + name, attn_implementation="eager")
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out[name] = {"logits": model(tokens).logits, "dtype": model.dtype,
                     "tied": model.lm_head.weight is model.get_input_embeddings().weight}
torch.save(out, sys.argv[1] + "/from_pretrained.pt")
"""


@pytest.fixture(scope="module")
def exported(job, reports) -> dict[str, str]:
    """`trainer checkpoint export --format hf` of the sharded checkpoints written at fsdp=2 (GPT-2) and tp=2 (Llama)."""
    _, out = job
    said = {}
    for name, config in (("gpt2_fsdp", "gpt2_fsdp"), ("llama_tp2", "llama_fsdp/config.json")):
        done = subprocess.run([sys.executable, "-m", "trainer", "checkpoint", "export", "--format", "hf",
                               str(out / f"{name}.ckpt"), str(out / f"{name}_exported"), "--config", str(out / config),
                               "--max-shard-size", "100KB"], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        said[name] = done.stdout
    return said


@pytest.fixture(scope="module")
def loaded(job, reports, exported) -> dict:
    """Each exported folder loaded by transformers alone, in a fresh process that cannot import this framework."""
    _, out = job
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    folders = ["llama_fsdp", "gpt2_fsdp", "gpt2_ddp", "llama_tp2", "gpt2_fsdp_exported", "llama_tp2_exported",
               "llama_tp2_mc/trained.hf"]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", FROM_PRETRAINED, str(out), *folders], cwd=out, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out / "from_pretrained.pt", weights_only=False)


@pytest.mark.parametrize("layout", ["llama_fsdp", "gpt2_fsdp", "gpt2_ddp", "llama_tp2"])
def test_from_pretrained_in_a_fresh_process_gives_the_trained_models_logits(reports, loaded, layout):
    assert torch.allclose(loaded[layout]["logits"], reports[0][f"{layout}_logits"], atol=1e-6, rtol=0)
    assert loaded[layout]["dtype"] == torch.float32


def test_model_checkpoint_save_hf_at_tp2_writes_a_folder_with_the_trained_logits(job, loaded, reports):
    _, out = job
    assert sorted(p.name for p in (out / "llama_tp2_mc").iterdir()) == ["trained.ckpt", "trained.hf"]
    assert torch.allclose(loaded["llama_tp2_mc/trained.hf"]["logits"], reports[0]["llama_tp2_logits"], atol=1e-6,
                          rtol=0)  # fmt: skip


def test_an_exported_folder_is_sharded_with_its_index_config_and_tied_weights_once(job, reports, loaded):
    _, out = job
    folder = out / "gpt2_fsdp"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(files) > 1 and set(index["weight_map"].values()) == set(files)
    assert all(p.stat().st_size < 60_000 + 50_000 for p in folder.glob("*.safetensors"))  # max_shard_size=60KB
    assert "lm_head.weight" not in index["weight_map"] and "transformer.wte.weight" in index["weight_map"]
    assert loaded["gpt2_fsdp"]["tied"]  # transformers ties the head to the embedding again
    assert (folder / "config.json").is_file() and (folder / "generation_config.json").is_file()
    assert not (folder / ".sharded-parts").exists()


SLACK = 8 * 2**20  # Python's and the writer threads' own allocations


def test_save_pretrained_memory_stays_within_the_ranks_shards_and_one_file(reports):
    for report in reports:
        bound = report["export_local"] + report["export_largest_file"] + SLACK
        assert report["export_files"] > 10
        assert report["export_growth"] <= bound, report
        assert bound < report["export_model"]  # a rank gathering the model would pass the bound


def test_exporting_a_sharded_checkpoint_never_holds_the_model(reports):
    report = reports[0]  # the export ran on rank 0, from the fsdp=2 folder (weights and AdamW state)
    assert report["cli_export_growth"] <= 3 * report["export_largest_file"] + SLACK, report
    assert 3 * report["export_largest_file"] + SLACK < report["export_model"] / 2


@pytest.mark.parametrize("name, trained", [("gpt2_fsdp", "gpt2_fsdp"), ("llama_tp2", "llama_tp2")])
def test_trainer_checkpoint_export_of_a_sharded_checkpoint_loads_with_the_trained_logits(reports, exported, loaded,
                                                                                         name, trained):  # fmt: skip
    assert "safetensors file(s)" in exported[name] and "from 'model.*'" in exported[name]  # the prefix it found
    assert torch.allclose(loaded[f"{name}_exported"]["logits"], reports[0][f"{trained}_logits"], atol=1e-6, rtol=0)


def test_load_pretrained_at_tp2_starts_from_one_processs_logits(reports, loaded):
    for report in reports:  # the llama_fsdp folder, loaded while the model was on meta at dp_shard=1 x tp=2
        assert torch.allclose(report["llama_tp2_loaded_logits"], loaded["llama_fsdp"]["logits"], atol=1e-5, rtol=0)


def test_one_process_export_in_bf16_loads_as_bf16_with_the_same_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer.hf import load_pretrained, save_pretrained

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_job.hf_config("llama"))
    save_pretrained(model, tmp_path / "bf16", dtype="bf16")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert again.dtype == torch.bfloat16 and json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight.to(torch.bfloat16))
    assert model.config.dtype in (None, torch.float32)  # the trained model's own config is left as it was
    fresh = AutoModelForCausalLM.from_config(hf_job.hf_config("llama"))
    load_pretrained(fresh, tmp_path / "bf16")  # into a float32 model: the bf16 values, widened
    assert torch.equal(fresh.model.embed_tokens.weight, again.model.embed_tokens.weight.float())
    model.save_pretrained(tmp_path / "theirs")  # transformers' own folder: one model.safetensors, no index
    load_pretrained(fresh, tmp_path / "theirs")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_misuse_says_what_was_wrong(tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer.hf import load_pretrained, save_pretrained
    from trainer.strategies.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="needs a Hugging Face transformers model"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")
    model = AutoModelForCausalLM.from_config(hf_job.hf_config("gpt2"))
    with pytest.raises(ConfigurationError, match="max_shard_size='lots' is not a size"):
        save_pretrained(model, tmp_path / "x", max_shard_size="lots")
    with pytest.raises(ConfigurationError, match="is a URL"):
        save_pretrained(model, "s3://bucket/x")
    with pytest.raises(ConfigurationError, match="holds no safetensors weights"):
        load_pretrained(model, tmp_path)
    save_pretrained(model, tmp_path / "gpt2")
    with pytest.raises(ConfigurationError, match="has no weights for"):
        load_pretrained(AutoModelForCausalLM.from_config(hf_job.hf_config("llama")), tmp_path / "gpt2")
    with torch.device("meta"):
        on_meta = AutoModelForCausalLM.from_config(hf_job.hf_config("gpt2"))
    with pytest.raises(ConfigurationError, match="still on the meta device"):
        save_pretrained(on_meta, tmp_path / "meta")


def test_a_transformers_model_under_pipeline_parallel_is_refused_saying_what_works():
    from transformers import AutoModelForCausalLM

    from trainer.strategies.errors import ConfigurationError
    from trainer.strategies.nd.hf_plan import refuse_pipelined_hf

    holder = torch.nn.Module()
    holder.model = AutoModelForCausalLM.from_config(hf_job.hf_config("llama"))
    with pytest.raises(ConfigurationError, match="LlamaForCausalLM's forward .* cannot run as a stage.*dp_shard x tp"):
        refuse_pipelined_hf(holder)
    refuse_pipelined_hf(torch.nn.Linear(2, 2))  # other modules: pipeline parallel decides


def test_the_hf_plan_strings_map_to_torch_styles_and_an_unknown_one_is_named():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from transformers import AutoModelForCausalLM

    from trainer.strategies.errors import ConfigurationError
    from trainer.strategies.nd.hf_plan import hf_tp_plan

    model = AutoModelForCausalLM.from_config(hf_job.hf_config("llama"))
    plan = hf_tp_plan(model, "model")
    assert isinstance(plan["model.model.layers.*.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["model.model.layers.*.self_attn.o_proj"], RowwiseParallel)
    head = plan["model.lm_head"]  # the head gives whole logits: the user's loss is as on one device
    assert isinstance(head, ColwiseParallel) and head.output_layouts == (Replicate(),)
    model._tp_plan = {"lm_head": "packed_colwise"}
    with pytest.raises(ConfigurationError, match=r"styles \['packed_colwise'\]"):
        hf_tp_plan(model)


def test_hf_checkpoint_writes_every_n_epochs_and_at_the_end(tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer import Trainer
    from trainer.callbacks import HFCheckpoint
    from trainer.strategies.errors import ConfigurationError

    callback = HFCheckpoint(tmp_path / "hf", every_n_epochs=1, dtype="bf16")
    module = hf_job.CausalLM("gpt2")
    Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=2, logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, callbacks=[callback]).fit(
        module, torch.utils.data.DataLoader(hf_job.dataset(), batch_size=4))  # fmt: skip
    assert callback.saved == [tmp_path / "hf" / "epoch=0", tmp_path / "hf" / "epoch=1", tmp_path / "hf"]
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert final.dtype == torch.bfloat16
    assert torch.equal(final.transformer.wte.weight, module.model.transformer.wte.weight.to(torch.bfloat16))
    with pytest.raises(ConfigurationError, match="every_n_epochs=0"):
        HFCheckpoint(tmp_path, every_n_epochs=0)


def test_model_checkpoint_save_hf_writes_a_folder_beside_each_checkpoint_and_deletes_it_with_it(tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer import Trainer
    from helpers import Regressor, loader
    from trainer.callbacks import ModelCheckpoint
    from trainer.strategies.errors import ConfigurationError

    callback = ModelCheckpoint(tmp_path, save_top_k=1, every_n_epochs=1, save_hf=True)  # keeps the latest only
    module = hf_job.CausalLM("gpt2")
    Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=2, logger=False, enable_progress_bar=False,
            enable_model_summary=False, callbacks=[callback]).fit(
        module, torch.utils.data.DataLoader(hf_job.dataset(), batch_size=4))  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=1-step=4.ckpt", "epoch=1-step=4.hf"]
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "epoch=1-step=4.hf")
    assert all(torch.equal(saved.state_dict()[name], value) for name, value in module.model.state_dict().items())

    with pytest.raises(ConfigurationError, match="save_hf=True"):
        ModelCheckpoint("s3://bucket/ckpts", save_hf=True)
    with pytest.raises(ConfigurationError, match=r"ModelCheckpoint\(save_hf=True\) needs a Hugging Face"):
        Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=1, logger=False,
                enable_progress_bar=False, enable_model_summary=False,
                callbacks=[ModelCheckpoint(tmp_path / "plain", save_hf=True)]).fit(
            Regressor(), loader())  # fmt: skip
