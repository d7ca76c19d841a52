"""Deferred initialisation in one process: a module built on ``meta`` under a sharded strategy's init context and
materialised gets exactly the tensors its code gives when built eagerly, however the code seeds and draws, and
nothing is ever left holding whatever memory held: what cannot be reproduced is rebuilt eagerly or refused by name.

(The same at real layouts, 2 and 4 gloo ranks, is tests/test_init_layouts.py.)
"""
from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch
from torch import nn
from torch.nn.init import dirac_, orthogonal_, sparse_, trunc_normal_  # imported before any build

from trainer import Trainer, TrainModule, seed_everything
from trainer.strategies import ConfigurationError
from trainer.strategies.precision.plugins import Precision
from trainer.strategies.speed.deferred_init import materialize, module_init_context
from trainer.strategies.speed.init_check import InitMismatchError, verify_initial_weights
from trainer.strategies.speed.module_build import build_module, eager_reference

CPU = torch.device("cpu")


def recorded_context(device: torch.device = CPU):
    return module_init_context(device, Precision(), None, meta=True)


def eager_context(device: torch.device = CPU):
    return module_init_context(device, Precision(), None, meta=False)


def tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(itertools.chain(module.named_parameters(remove_duplicate=False),
                                module.named_buffers(remove_duplicate=False)))  # fmt: skip


def assert_identical(module: nn.Module, expected: nn.Module) -> None:
    got, want = tensors(module), tensors(expected)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


def built_both_ways(make, seed: int = 0, device: torch.device = CPU) -> tuple[nn.Module, nn.Module]:
    """(eager build on ``device``, meta build materialised there), each after ``seed``; the generator after each
    must agree too."""
    torch.manual_seed(seed)
    with eager_context(device):
        eager = make()
    after_eager = torch.randn(3, device=device)
    torch.manual_seed(seed)
    with recorded_context(device):
        deferred = make()
    after_build = torch.randn(3, device=device)
    materialize(deferred, device)
    assert torch.equal(after_build, after_eager), "the generator after the build differs from the eager build's"
    return eager, deferred


# ---------------------------------------------------------------------------------------------- seeding
class SeededInside(nn.Module):
    """Seeds inside its own build, as a configure_model that calls torch.manual_seed does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.a = nn.Linear(8, 8)
        seed_everything(7)
        self.b = nn.Linear(8, 8)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(99)
            self.c = nn.Linear(8, 4)
        self.d = nn.Embedding(5, 8)


def test_a_seed_set_inside_the_build_gives_the_eager_weights_whatever_the_seed_outside():
    eager, deferred = built_both_ways(SeededInside, seed=0)
    assert_identical(deferred, eager)
    _, other = built_both_ways(SeededInside, seed=5)  # another outside seed: the seeded parts are the same
    assert torch.equal(other.a.weight, eager.a.weight) and torch.equal(other.b.weight, eager.b.weight)
    assert torch.equal(other.c.weight, eager.c.weight)


class GeneratorObjects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.w = nn.Parameter(torch.empty(6, 6))
        nn.init.normal_(self.w, std=0.1, generator=generator)
        self.v = nn.Parameter(torch.empty(6))
        nn.init.uniform_(self.v, -1, 1, generator=generator)  # the same generator, moved on by the draw above
        self.u = nn.Parameter(torch.randn(4, generator=generator))
        self.z = nn.Parameter(torch.empty(4, 4))
        nn.init.kaiming_uniform_(self.z, generator=torch.Generator().manual_seed(5))
        self.generator = generator


def test_generator_objects_handed_to_init_functions_draw_as_in_the_eager_build():
    eager, deferred = built_both_ways(GeneratorObjects)
    assert_identical(deferred, eager)
    assert torch.equal(deferred.generator.get_state(), eager.generator.get_state())  # it moved as it did eagerly


# ---------------------------------------------------------------------------------------------- init functions
class ImportedInits(nn.Module):
    """nn.init functions that return at once on meta, called through names imported before the build."""

    def __init__(self) -> None:
        super().__init__()
        self.t = nn.Parameter(torch.empty(16, 8))
        trunc_normal_(self.t, std=0.5, a=-0.6, b=0.6)  # rejection sampling: how many draws depends on values
        self.o = nn.Parameter(torch.empty(8, 8))
        orthogonal_(self.o)
        self.s = nn.Parameter(torch.empty(8, 6))
        sparse_(self.s, sparsity=0.5)
        self.c = nn.Parameter(torch.empty(4, 4, 3))
        dirac_(self.c)
        self.after = nn.Parameter(torch.randn(5))  # drawn after all of them: the generator must be right


def test_nn_init_functions_that_skip_meta_are_recorded_however_they_were_imported():
    eager, deferred = built_both_ways(ImportedInits)
    assert_identical(deferred, eager)


class Buffers(nn.Module):
    """Buffers computed in __init__, a tied weight, a partial in-place draw through .data, __setitem__."""

    def __init__(self) -> None:
        super().__init__()
        inverse = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
        angles = torch.outer(torch.arange(6).float(), inverse)
        self.register_buffer("rope", torch.polar(torch.ones_like(angles), angles), persistent=False)  # complex64
        self.register_buffer("positions", torch.arange(6), persistent=False)
        self.register_buffer("causal", torch.ones(6, 6, dtype=torch.bool).tril())
        self.embed = nn.Embedding(10, 8, padding_idx=0)
        self.embed.weight.data[1:3].normal_(std=0.5)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight
        self.linear = nn.Linear(8, 8)
        with torch.no_grad():
            self.linear.bias[0] = 5.0
            self.linear.weight.copy_(self.linear.weight)  # a tensor copied onto itself keeps its values


def test_computed_buffers_tied_weights_and_partial_writes_replay_exactly():
    eager, deferred = built_both_ways(Buffers)
    assert_identical(deferred, eager)
    assert deferred.head.weight is deferred.embed.weight
    assert deferred.rope.dtype == torch.complex64 and torch.allclose(deferred.rope.abs(), torch.ones(6, 4))


class WithRealParts(nn.Module):
    """A layer made before the build (real tensors) reused in it, and a buffer built on the CPU on purpose
    (torchtitan's ``init_weights(buffer_device=...)``)."""

    def __init__(self, stem: nn.Module) -> None:
        super().__init__()
        self.stem = stem
        self.body = nn.Linear(4, 4)
        with torch.device("cpu"):
            self.register_buffer("table", torch.arange(12.0).reshape(3, 4), persistent=False)


def test_real_tensors_in_a_meta_build_keep_their_values():
    torch.manual_seed(0)
    stem = nn.Linear(4, 4)
    expected_stem = stem.weight.detach().clone()
    torch.manual_seed(1)
    eager = WithRealParts(stem)
    torch.manual_seed(1)
    with recorded_context():
        deferred = WithRealParts(stem)
    assert deferred.body.weight.is_meta and not deferred.table.is_meta and not deferred.stem.weight.is_meta
    materialize(deferred, CPU)
    assert_identical(deferred, eager)
    assert torch.equal(deferred.stem.weight, expected_stem)


# ---------------------------------------------------------------------------------------------- transformers
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed (the test extra installs it)")  # fmt: skip


@needs_transformers
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_transformers_model_gets_its_own_init_not_its_layers_defaults(kind):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    config = (LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=64) if kind == "llama"
              else GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16))  # fmt: skip
    eager, deferred = built_both_ways(lambda: AutoModelForCausalLM.from_config(config))
    assert_identical(deferred, eager)
    embedding = deferred.get_input_embeddings().weight
    assert 0.015 < embedding.std() < 0.025  # _init_weights' N(0, 0.02), not nn.Embedding's N(0, 1)


# ---------------------------------------------------------------------------------------------- never uninitialised
class LeftEmpty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ok = nn.Linear(2, 2)
        self.register_buffer("cache", torch.empty(4))  # never written: garbage on one device too


def test_a_tensor_made_by_torch_empty_and_never_written_is_named():
    with recorded_context():
        module = LeftEmpty()
    with pytest.raises(ConfigurationError, match=r"\['cache'\] are never wholly written.*torch.zeros"):
        materialize(module, CPU)


class HalfWritten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, 4))
        with torch.no_grad():
            self.w[:2] = 1.0  # only the first two rows
            self.w[2:].mul_(2.0)  # reads garbage: still garbage


def test_a_tensor_written_only_in_part_is_named():
    with recorded_context():
        module = HalfWritten()
    with pytest.raises(ConfigurationError, match=r"\['w'\] are never wholly written"):
        materialize(module, CPU)


class HandBuiltWithBuffer(nn.Module):
    """Built on meta by hand: reset_parameters() re-initialises the layers, but not the buffer __init__ computed."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def reset_parameters(self) -> None:
        pass  # the buffer is left as it is


def test_a_buffer_reset_parameters_does_not_recompute_is_named_not_left_as_garbage():
    with torch.device("meta"):
        module = HandBuiltWithBuffer()
    with pytest.raises(ConfigurationError, match=r"\['scale'\] were not \(wholly\) written by the reset_parameters"):
        materialize(module, CPU)


class ReadsBeforeWriting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(3))

    def init_weights(self) -> None:
        self.w.mul_(0.5)  # scales memory it never wrote


def test_an_init_weights_that_scales_unwritten_memory_is_named():
    with torch.device("meta"):
        module = ReadsBeforeWriting()
    with pytest.raises(ConfigurationError, match=r"\['w'\] were not \(wholly\) written by init_weights"):
        materialize(module, CPU)


# ---------------------------------------------------------------------------------------------- fallback
class ReadsAValue(nn.Module):
    """Code that reads a weight's value while building: it cannot run on meta."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        if self.layer.weight.abs().max().item() > 0.01:
            nn.init.zeros_(self.layer.bias)


class Holder(nn.Module):
    def __init__(self, make) -> None:
        super().__init__()
        self.make = make
        self.model = None

    def build(self) -> None:
        torch.manual_seed(21)
        self.model = self.make()


def test_a_build_that_fails_on_meta_is_redone_eagerly_with_one_warning_and_the_eager_weights():
    reference = Holder(ReadsAValue)
    reference.build()
    holder = Holder(ReadsAValue)
    with pytest.warns(UserWarning, match=r"could not be recorded.*item.*built eagerly on cpu"):
        build_module(holder, holder.build, recorded_context, eager_context, CPU)
    assert not holder.model.layer.weight.is_meta
    assert_identical(holder.model, reference.model)


class DrawsByValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        rates = torch.full((5,), 3.0)
        self.register_buffer("counts", torch.poisson(rates))  # how many draws depends on the rates' values


def test_a_draw_whose_count_depends_on_values_is_redone_eagerly():
    reference = Holder(DrawsByValue)
    reference.build()
    holder = Holder(DrawsByValue)
    with pytest.warns(UserWarning, match="depends on the values of its inputs"):
        build_module(holder, holder.build, recorded_context, eager_context, CPU)
    assert_identical(holder.model, reference.model)


class Enormous(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(2**40))  # 4 TiB
        if self.weight[0].item() > 0:
            pass


def test_a_build_that_cannot_be_replayed_and_fits_nowhere_is_refused_naming_the_construct():
    holder = Holder(Enormous)
    with pytest.raises(ConfigurationError, match=r"cannot be built on the meta device.*item.*4.0 TiB|4096.0 GiB"):
        build_module(holder, holder.build, recorded_context, eager_context, CPU)
    assert holder.model is None  # the module was put back as it was


def test_undoing_a_build_puts_back_attributes_generators_and_tensors_written_in_place():
    holder = Holder(lambda: nn.Linear(2, 2))
    holder.existing = nn.Linear(2, 2)
    before = holder.existing.weight.detach().clone()

    def build() -> None:
        holder.build()
        holder.extra = nn.Linear(3, 3)
        with torch.no_grad():
            holder.existing.weight.add_(1.0)  # a real tensor the build changes in place
        torch.randn(4)
        raise RuntimeError("cannot run on meta")  # then the eager rebuild also sees .add_ once

    state = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="cannot run on meta"), pytest.warns(UserWarning):
        build_module(holder, build, recorded_context, eager_context, CPU)
    # the failed meta build was undone before the eager one ran, so the weight moved by 1 once, not twice
    assert torch.equal(holder.existing.weight, before + 1.0)
    assert not torch.equal(torch.get_rng_state(), state)


# ---------------------------------------------------------------------------------------------- check_init
class SkipsInitOnMeta(nn.Module):
    """Initialises differently when it sees it is on meta: what check_init is for."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        if not self.layer.weight.is_meta:
            nn.init.zeros_(self.layer.weight)


def test_check_init_names_the_first_tensor_that_differs_from_the_eager_build():
    holder = Holder(SkipsInitOnMeta)
    reference = eager_reference(holder, holder.build, eager_context, CPU)
    assert holder.model is None  # put back after the reference build
    build_module(holder, holder.build, recorded_context, eager_context, CPU)
    materialize(holder, CPU)
    with pytest.raises(InitMismatchError, match=r"model.layer.weight .*differs from the eager one-device build"):
        verify_initial_weights(holder, reference)


def test_check_init_passes_for_a_build_the_replay_reproduces():
    holder = Holder(Buffers)
    reference = eager_reference(holder, holder.build, eager_context, CPU)
    build_module(holder, holder.build, recorded_context, eager_context, CPU)
    materialize(holder, CPU)
    assert verify_initial_weights(holder, reference) == len(tensors(holder))


# ---------------------------------------------------------------------------------------------- on a GPU
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run by make gpu-check)")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("make", [SeededInside, ImportedInits, Buffers], ids=lambda make: make.__name__)
def test_a_build_recorded_for_the_gpu_replays_the_gpus_own_draws(make):
    eager, deferred = built_both_ways(make, device=torch.device("cuda"))
    assert_identical(deferred, eager)
    assert all(t.device.type == "cuda" for t in tensors(deferred).values())


@pytest.mark.cuda
@needs_cuda
def test_check_init_passes_for_fsdp_on_one_gpu():
    module = CountsInit()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, 3)), batch_size=2)
    Trainer(accelerator="cuda", devices=1, strategy="fsdp", check_init=True, max_steps=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(module, data)  # fmt: skip
    assert module.layer.weight.full_tensor().eq(0.25).all()


# ---------------------------------------------------------------------------------------------- the Trainer's build
class CountsInit(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer, self.calls = None, 0

    def configure_model(self) -> None:
        self.layer = nn.Linear(3, 1)

    def init_weights(self) -> None:
        self.calls += 1
        nn.init.constant_(self.layer.weight, 0.25)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def one_device(**kwargs) -> Trainer:
    return Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, **kwargs)  # fmt: skip


def test_init_weights_runs_once_after_configure_model_on_one_device_too():
    module = CountsInit()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, 3)), batch_size=2)
    one_device(check_init=True).fit(module, data)
    assert module.calls == 1  # (check_init's reference build ran it too, on a build that was then undone)
    assert torch.equal(module.layer.weight, torch.full((1, 3), 0.25))


def test_check_init_comes_from_the_environment_and_bad_values_are_refused(monkeypatch):
    monkeypatch.setenv("TRAINER_CHECK_INIT", "1")
    assert one_device().check_init is True
    monkeypatch.setenv("TRAINER_CHECK_INIT", "maybe")
    with pytest.raises(ConfigurationError, match="TRAINER_CHECK_INIT='maybe'"):
        one_device()
    monkeypatch.delenv("TRAINER_CHECK_INIT")
    with pytest.raises(ConfigurationError, match="check_init='yes' must be True or False"):
        one_device(check_init="yes")


class ReadsAWeightInConfigureModel(CountsInit):
    def configure_model(self) -> None:
        torch.manual_seed(3)
        self.layer = nn.Linear(3, 1)
        self.largest = self.layer.weight.abs().max().item()  # a value: cannot run on meta

    def init_weights(self) -> None:
        self.calls += 1


@pytest.fixture
def own_process_group():
    """A one-process job's process group and job variables end with the test (later tests start real jobs)."""
    import os

    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_under_a_sharded_strategy_a_configure_model_that_reads_values_is_built_eagerly_and_checked(own_process_group):
    module = ReadsAWeightInConfigureModel()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, 3)), batch_size=2)
    with pytest.warns(UserWarning, match=r"could not be recorded.*item.*built eagerly on cpu"):
        one_device(devices=1, strategy="fsdp", check_init=True).fit(module, data)
    torch.manual_seed(3)
    expected = nn.Linear(3, 1)
    assert torch.equal(module.layer.weight.full_tensor(), expected.weight.detach())
    assert module.calls == 1 and module.largest == expected.weight.abs().max().item()
