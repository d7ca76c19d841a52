"""The memory planner on N-D layouts (data parallel replicated and sharded × tensor parallel × pipeline parallel).

The per-rank figures are pinned to the real thing: tests/scripts/layout_bytes.py builds each layout with
torch's own APIs (``init_device_mesh``, ``parallelize_module`` with the built-in megatron plan,
``fully_shard``, ``torch.distributed.pipelining``) on 4 gloo processes, runs a step, and records the storage
every rank allocated for its local parameters, gradients and optimizer state. They agree to the byte,
FSDP2's padding of uneven shards, ``distribute_tensor``'s padded scatter buffers and the whole gradient of a
row-parallel embedding included. The rest checks the pieces the figures rest on (tied weights, plans,
pipeline stages, activations) and the command line on nanoGPT's GPT-2 XL.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer.strategies import ConfigurationError
from trainer.strategies.nd.device_map import plan_device_map, tensor_devices
from trainer.strategies.nd.pipeline_stages import auto_boundaries, parameter_stages
from trainer.strategies.nd.tp_plan import megatron_plan, resolve_tp_plan, tp_shard_dims
from test_ddp_processes import RUN_TIMEOUT_S, clean_env
from trainer.strategies.nd.mesh import MeshLayout, resolve_layout
from trainer.memory.planner import estimate, estimate_layout

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


nanogpt = load("nanogpt")
layout_bytes = load("layout_bytes")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("layouts")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
               str(SCRIPTS / "layout_bytes.py"), "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(4)]


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize("layout", layout_bytes.LAYOUTS, ids=lambda layout: layout.name)
def test_planned_bytes_equal_what_each_rank_allocates(ranks, layout):
    for rank in ranks:
        entry = rank[layout.name]
        assert entry["planned"] == entry["measured"], f"rank {rank['rank']}"


def test_zero1_slices_step_exactly_as_the_whole_optimizer_and_as_planned(ranks):
    shares = []
    for rank in ranks:
        entry = rank["zero1"]
        assert entry["max_difference"] == 0.0
        assert entry["optimizer_state"] == entry["planned_optimizer_state"]
        shares.append(entry["optimizer_state"])
    assert max(shares) / min(shares) < 1.2, shares  # 4 uneven ranks: 13, 13, 13 and 11 rows of the embedding


def test_sharding_divides_the_parameters_by_the_model_parallel_degree():
    with torch.device("meta"):
        model = nanogpt.GPT2XL()
    whole = sum(p.numel() for p in model.parameters()) * 4
    assert whole == 1_557_611_200 * 4  # GPT-2 XL with tied embeddings
    for layout in (MeshLayout(dp_shard=8), MeshLayout(dp_shard=4, tp=2), MeshLayout(tp=8), MeshLayout(dp_shard=2, pp=4)):
        plan = estimate_layout(model, layout, tp_plan="megatron", auto_wrap_policy={nanogpt.Block})
        share = plan.peak.parameters / whole
        # TP replicates norms, biases and position embeddings; PP stages hold whole blocks (and the tied copy)
        limit = 1.10 if layout.pp > 1 else 1.01
        assert 1 / 8 <= share <= limit / 8, (layout.name, share * 8)


# ---------------------------------------------------------------------------------------------- tied weights
def test_tied_head_is_placed_with_its_embedding_and_counted_once():
    model = nanogpt.GPT2Tiny()
    plan = plan_device_map(model, [0, 1, 2, 3])
    placed = tensor_devices(model, plan)  # raised "does not place ['lm_head.weight']" before
    assert placed["lm_head.weight"] == placed["transformer.wte.weight"] == 0
    unique = sum(p.numel() * 4 for p in model.parameters())
    memory = estimate(model, "model_parallel", 4, optimizer="sgd")
    assert sum(d.parameters for d in memory.devices) == unique + sum(b.numel() * 4 for b in model.buffers())
    assert "'lm_head' runs on device 0, where its tied weight is" in memory.notes
    assert estimate(model, "ddp", 2).devices[0].parameters == unique


def test_a_plan_that_splits_tied_weights_differently_is_refused():
    from torch.distributed.tensor.parallel import ColwiseParallel

    model = nanogpt.GPT2Tiny()
    with pytest.raises(ConfigurationError, match=r"'transformer.wte.weight' and 'lm_head.weight' are one tensor"):
        tp_shard_dims(model, resolve_tp_plan(model, {"lm_head": ColwiseParallel()}))


def test_pipeline_stages_each_hold_a_copy_of_a_weight_tied_across_them():
    model = nanogpt.GPT2Tiny()
    stages = parameter_stages(model, ["transformer.h.2"])
    assert stages["transformer.wte.weight"] == 0 and stages["lm_head.weight"] == 1
    plan = estimate_layout(model, MeshLayout(pp=2), pipeline=["transformer.h.2"], optimizer="sgd")
    embedding = model.lm_head.weight.numel() * 4
    first = sum(p.numel() * 4 for n, p in model.named_parameters() if stages[n] == 0)
    assert plan.devices[0].parameters == first
    assert plan.devices[1].parameters == sum(p.numel() * 4 for p in model.parameters()) - first + embedding
    assert any("stages 0 and 1 each hold a copy of 'transformer.wte.weight'" in note for note in plan.notes)


# ---------------------------------------------------------------------------------------------- plans
def test_megatron_plan_splits_attention_and_mlp_pairs_and_the_vocabulary():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = megatron_plan(nanogpt.GPT2Tiny())
    assert {key: type(style) for key, style in plan.items()} == {
        "transformer.wte": RowwiseParallel,
        "transformer.h.*.attn.c_attn": ColwiseParallel,
        "transformer.h.*.attn.c_proj": RowwiseParallel,
        "transformer.h.*.mlp.c_fc": ColwiseParallel,
        "transformer.h.*.mlp.c_proj": RowwiseParallel,
        "lm_head": ColwiseParallel,
    }


def test_plan_misuse_is_named():
    from torch.distributed.tensor.parallel import ColwiseParallel

    model = nanogpt.GPT2Tiny()
    with pytest.raises(ConfigurationError, match=r"key 'transformer.blocks.\*' matches no submodule"):
        resolve_tp_plan(model, {"transformer.blocks.*": ColwiseParallel()})
    with pytest.raises(ConfigurationError, match="nn.Linear and nn.Embedding only"):
        tp_shard_dims(model, resolve_tp_plan(model, {"transformer.ln_f": ColwiseParallel()}))
    with pytest.raises(ConfigurationError, match="tp=2 needs a tensor-parallel plan"):
        estimate_layout(model, MeshLayout(tp=2))
    with pytest.raises(ConfigurationError, match=r"dp_shard=3 × tp=2 = 6 does not divide the 4 processes"):
        resolve_layout(4, dp_shard=3, tp=2)
    assert resolve_layout(8, dp_shard=-1, tp=2, pp=2) == MeshLayout(dp_shard=2, tp=2, pp=2)
    with pytest.raises(ConfigurationError, match="in the order the modules are registered"):
        parameter_stages(model, ["transformer.h.2", "transformer.h.1"])


def test_automatic_pipeline_split_keeps_blocks_whole_and_balances_bytes():
    with torch.device("meta"):
        model = nanogpt.GPT2XL()
    boundaries = auto_boundaries(model, 4, (nanogpt.Block,))
    assert all(b.startswith("transformer.h.") and b.count(".") == 2 for b in boundaries), boundaries
    plan = estimate_layout(model, MeshLayout(pp=4), pipeline=boundaries, optimizer="sgd")
    sizes = [d.parameters for d in plan.devices]
    assert max(sizes) / min(sizes) < 1.25, sizes  # the last stage also holds the tied head's copy


# ---------------------------------------------------------------------------------------------- activations
class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def test_tensor_parallel_shards_activations_between_the_colwise_and_rowwise_linears():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    x = torch.zeros(4, 8)
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    whole = estimate_layout(_Mlp(), MeshLayout(), example_input=x).devices[0].activations
    split = estimate_layout(_Mlp(), MeshLayout(tp=2), tp_plan=plan, example_input=x).devices[0].activations
    up_and_act, down = 2 * 4 * 32 * 4, 4 * 8 * 4
    assert whole == up_and_act + down and split == up_and_act // 2 + down


def test_pipeline_stages_hold_the_micro_batches_their_schedule_keeps_in_flight():
    model, x = nanogpt.GPT2Tiny(), nanogpt.GPT2Tiny().example_input_array
    kwargs = dict(pipeline=["transformer.h.2"], example_input=x, microbatches=4)
    one_f_one_b = estimate_layout(model, MeshLayout(pp=2), **kwargs).devices
    gpipe = estimate_layout(model, MeshLayout(pp=2), schedule="GPipe", **kwargs).devices
    assert [d.in_flight for d in one_f_one_b] == [2, 1] and [d.in_flight for d in gpipe] == [4, 4]
    for device in one_f_one_b + gpipe:
        assert device.activations == device.in_flight * device.activations_per_microbatch


# ---------------------------------------------------------------------------------------------- command line
def test_command_plans_nanogpt_xl_with_tied_weights_per_strategy_and_per_layout(capsys):
    from trainer.cli import main

    model = str(SCRIPTS / "nanogpt.py") + ":GPT2XL"
    assert main(["estimate-memory", model, "--world-size", "8", "--wrap", "Block"]) == 0
    out = capsys.readouterr().out
    assert "'lm_head.weight' is tied to 'transformer.wte.weight': counted once" in out
    assert "fsdp" in out and "model_parallel" in out
    assert main(["estimate-memory", model, "--world-size", "8", "--wrap", "Block", "--precision", "bf16-mixed",
                 "--tp", "1,2", "--pp", "1,4", "--tp-plan", "megatron", "--device-memory", "80GB"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split()[0] for line in lines[3:7]]
    assert [line.split("  ")[0].strip() for line in lines[3:7]] == ["dp_shard=8", "dp_shard=4 tp=2", "dp_shard=2 pp=4",
                                                                      "tp=2 pp=4"], rows  # fmt: skip
    assert any(line.startswith("Use dp_shard=8: its plan on fake ranks peaks at") for line in lines)
    assert "    'transformer.h.*.attn.c_attn': ColwiseParallel()," in lines
    assert main(["estimate-memory", model, "--world-size", "8", "--dp-shard", "3", "--tp", "2"]) == 2
    assert "dp_shard=3 × tp=2 = 6 does not divide the 8 processes" in capsys.readouterr().err
