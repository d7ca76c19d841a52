"""The Engine in one process: what a hand-written loop gets from it, and the errors misuse gets.

The multi-process behaviour (DDP parity with the Trainer, exact resume after a kill, collectives) is in
test_engine_processes.py; ``launch`` with forked ranks is here because forking is fast.
"""
from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from helpers import regression_data
from trainer.strategies import ConfigurationError, DDPStrategy
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError
from trainer import Engine, Trainer

ROOT = Path(__file__).resolve().parents[1]


def engine(**kwargs) -> Engine:
    return Engine(accelerator="cpu", devices=1, **kwargs)


def mlp(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(dropout), nn.Linear(8, 1))


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def train(eng: Engine, model, optimizer, loader, epochs: int = 2, clip: float = 0.0, record=None) -> None:
    for _ in range(epochs):
        for x, y in loader:
            with eng.accumulate(model):
                eng.backward(F.mse_loss(model(x), y))
                if record is not None:
                    record.append(eng.sync_gradients)
                if clip:
                    eng.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                optimizer.zero_grad()


# ---------------------------------------------------------------------------------------------- the step
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_accumulation_and_clipping_equal_the_plain_pytorch_loop(precision):
    """Windows of 2 with a partial last window, loss / 2, clipping of unscaled gradients, fp16 skips."""
    data = DataLoader(regression_data(n=40), batch_size=8)  # 5 batches: windows 2, 2, 1
    reference = mlp()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "16-mixed")
    for _ in range(2):
        for i, (x, y) in enumerate(data):
            with torch.autocast("cpu", dtype=torch.float16, enabled=precision == "16-mixed"):
                out = reference(x)
            scaler.scale(F.mse_loss(out.float(), y) / 2).backward()
            if i % 2 == 1 or i == 4:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

    eng = engine(precision=precision, accumulate_grad_batches=2)
    prepared = eng.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), data)
    syncs: list[bool] = []
    train(eng, *prepared, clip=0.5, record=syncs)
    assert syncs == [False, True, False, True, True] * 2
    assert same_weights(model, reference)


def test_optimizer_and_scheduler_do_nothing_inside_a_window():
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    eng = engine(accumulate_grad_batches=3)
    model, optimizer, scheduler = eng.prepare(model, optimizer, scheduler)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    before = copy.deepcopy(model.state_dict())
    with eng.accumulate(model):
        eng.backward(F.mse_loss(model(x), y))
        assert eng.clip_grad_norm_(model.parameters(), 1e-3) is None  # not clipped mid-window
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    assert not eng.sync_gradients
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())  # zero_grad kept them
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert scheduler.get_last_lr() == [0.1]
    for _ in range(2):
        with eng.accumulate(model):
            eng.backward(F.mse_loss(model(x), y))
            norm = eng.clip_grad_norm_(model.parameters(), 1e-3)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert eng.sync_gradients and norm is not None and norm > 1e-3
    assert scheduler.get_last_lr() == [0.05]
    assert all(p.grad is None for p in model.parameters())


def test_a_loader_without_length_ends_its_last_window():
    class Stream(IterableDataset):
        def __iter__(self):
            data = regression_data(n=40)
            return iter([(data.tensors[0][i : i + 8], data.tensors[1][i : i + 8]) for i in range(0, 40, 8)])

    model = mlp()
    eng = engine(accumulate_grad_batches=2)
    model, optimizer, loader = eng.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                           DataLoader(Stream(), batch_size=None))  # fmt: skip
    syncs: list[bool] = []
    train(eng, model, optimizer, loader, epochs=1, record=syncs)
    assert syncs == [False, True, False, True, True]
    assert loader.epoch == 1


def test_an_evaluation_loader_inside_a_window_does_not_end_it():
    model = mlp()
    eng = engine(accumulate_grad_batches=2)
    model, loader = eng.prepare(model, DataLoader(regression_data(n=32), batch_size=8))
    val = eng.prepare_data_loader(DataLoader(regression_data(n=16), batch_size=8), evaluation=True)
    syncs = []
    for x, y in loader:
        with eng.accumulate(model):
            eng.backward(F.mse_loss(model(x), y))
        syncs.append(eng.sync_gradients)
        with torch.no_grad():
            for vx, _ in val:  # a whole pass, last batch included
                model(vx)
    assert syncs == [False, True, False, True]
    assert not val.training and loader.training


def test_prepare_sets_up_modules_before_optimizers_and_returns_the_order_given():
    """64-true converts the parameters in place, so an optimizer given first still steps the module's."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(regression_data(n=16), batch_size=8)
    eng = engine(precision="64-true")
    p_loader, p_scheduler, p_optimizer, p_model = eng.prepare(loader, scheduler, optimizer, model)
    assert p_model is model and p_optimizer.optimizer is optimizer and p_scheduler.scheduler is scheduler
    assert isinstance(p_optimizer, torch.optim.Optimizer) and len(p_loader) == 2
    x, y = next(iter(p_loader))
    assert x.dtype == torch.float64 and next(model.parameters()).dtype == torch.float64
    before = next(model.parameters()).detach().clone()
    eng.backward(F.mse_loss(p_model(x), y))
    p_optimizer.step()
    assert not torch.equal(before, next(model.parameters()))
    assert eng.prepare(p_model) is p_model and eng.prepare(p_optimizer) is p_optimizer  # prepared twice: as is


@pytest.mark.parametrize("precision, half", [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)])
def test_a_prepared_module_runs_in_autocast_and_returns_float32(precision, half):
    model = mlp()
    seen = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    eng = engine(precision=precision)
    prepared = eng.prepare(model)
    assert prepared(torch.randn(2, 4)).dtype == torch.float32
    with eng.autocast():
        assert (torch.randn(2, 4) @ torch.randn(4, 2)).dtype == half
    assert eng.unwrap_model(prepared, keep_fp32_wrapper=False) is model
    model(torch.randn(2, 4))
    assert seen == [half, torch.float32]


# ---------------------------------------------------------------------------------------------- state
def _job_script():
    """tests/scripts/engine_job.py, whose resumable loop the multi-process test kills and resumes."""
    spec = importlib.util.spec_from_file_location("engine_job", ROOT / "tests" / "scripts" / "engine_job.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_save_state_inside_a_window_mid_epoch_resumes_bitwise_equal(tmp_path):
    """One process: 14 batches per epoch in windows of 3; saved after micro-batch 18 (epoch 1, inside a window),
    resumed by a new Engine with other initial weights and RNG."""
    job = _job_script()
    reference = job.resumable_loop(engine(precision="16-mixed", accumulate_grad_batches=3), tmp_path)
    assert job.resumable_loop(engine(precision="16-mixed", accumulate_grad_batches=3), tmp_path, save_at=18) is None
    resumed = job.resumable_loop(engine(precision="16-mixed", accumulate_grad_batches=3), tmp_path, resume=True)
    assert resumed["batches"] == reference["batches"] == 28 and resumed["lr"] == reference["lr"]
    assert all(torch.equal(v, reference["weights"][k]) for k, v in resumed["weights"].items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine_state.pt", "rank_0.pt"]
    state = torch.load(tmp_path / "engine_state.pt", weights_only=True)
    assert state["window_position"] == 1 and state["custom"] == [{"batches": 18}]
    assert torch.load(tmp_path / "rank_0.pt", weights_only=True)["loaders"][0]["batch_in_epoch"] == 4


def test_load_state_needs_the_same_objects_prepared(tmp_path):
    eng = engine()
    model = mlp()
    eng.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    eng.save_state(tmp_path)
    other = engine()
    other.prepare(mlp())
    with pytest.raises(CheckpointError, match="1 optimizers saved, 0 now"):
        other.load_state(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing"):
        other.load_state(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------- launch
def _rank_work(eng: Engine, scale: float) -> dict:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = eng.prepare(model, optimizer, DataLoader(regression_data(n=16), batch_size=4))
    for x, y in loader:
        eng.backward(F.mse_loss(model(x), y) * scale)
        optimizer.step()
        optimizer.zero_grad()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"ranks": eng.gather(torch.tensor(eng.process_index)).tolist(), "batches": len(loader),
            "same": bool((eng.gather(flat[None]) == flat).all()), "type": type(model).__name__}  # fmt: skip


@pytest.mark.timeout(120)
def test_launch_runs_the_function_on_forked_ranks_and_returns_rank_zero_result():
    eng = Engine(accelerator="cpu", devices=2, strategy=DDPStrategy(start_method="fork"))
    with pytest.raises(ConfigurationError, match=r"engine.launch\(fn\)"):
        eng.prepare(mlp())
    result = eng.launch(_rank_work, 0.5)
    assert result == {"ranks": [0, 1], "same": True, "batches": 2, "type": "DistributedDataParallel"}


# ---------------------------------------------------------------------------------------------- misuse
def test_backward_before_prepare_is_a_clear_error():
    eng = engine()
    model = mlp()
    with pytest.raises(ConfigurationError, match=r"before any module was prepared.*engine.prepare\(model"):
        eng.backward(model(torch.randn(2, 4)).sum())


@pytest.mark.parametrize("obj, name", [([1, 2], "list"), ("model", "str"), (range(3), "range")])
def test_preparing_an_object_of_unknown_type_names_it(obj, name):
    model = mlp()
    with pytest.raises(ConfigurationError, match=rf"got a {name} \(argument 1\).*torch.nn.Module"):
        engine().prepare(model, obj)


def test_clipping_without_gradients_is_a_clear_error():
    eng = engine()
    model = mlp()
    model, optimizer = eng.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigurationError, match=r"clip_grad_norm_\(\) found no gradients.*engine.backward\(loss\)"):
        eng.clip_grad_norm_(model.parameters(), 1.0)
    with pytest.raises(ConfigurationError, match=r"clip_grad_value_\(\) found no gradients"):
        eng.clip_grad_value_(model.parameters(), 1.0)


def test_other_misuse_gets_clear_errors():
    eng = engine()
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match="at least one"):
        eng.prepare()
    with pytest.raises(ConfigurationError, match="optimizer has not been prepared"):
        eng.prepare(torch.optim.lr_scheduler.StepLR(optimizer, 1))
    with pytest.raises(ConfigurationError, match="state_dict"):
        eng.register_for_checkpointing(object())
    with pytest.raises(ConfigurationError, match="needs a function"):
        eng.launch("train")
    with pytest.raises(ConfigurationError, match="reduction='avg'"):
        eng.reduce(torch.ones(1), "avg")
    with pytest.raises(ConfigurationError, match="loggers='wandb' is not valid"):
        engine(loggers="wandb")


def test_devices_2_where_the_program_cannot_be_rerun_points_to_launch():
    with pytest.raises(ConfigurationError, match=r"command that started this process.*pytest.*engine.launch\(fn\)"):
        Engine(accelerator="cpu", devices=2)


@pytest.mark.parametrize("argument, value", [
    ("accumulate_grad_batches", 0), ("precision", "17"), ("strategy", "nope"), ("num_nodes", 0), ("devices", 0),
    ("accelerator", "tpu"),
])  # fmt: skip
def test_engine_validates_the_shared_arguments_exactly_like_the_trainer(argument, value):
    settings = {"accelerator": "cpu", "devices": 1, argument: value}
    with pytest.raises(ConfigurationError) as from_trainer:
        Trainer(**settings)
    with pytest.raises(ConfigurationError) as from_engine:
        Engine(**settings)
    assert str(from_engine.value) == str(from_trainer.value)


def test_every_public_engine_member_is_documented():
    text = (ROOT / "docs" / "engine.md").read_text()
    documented = set(re.findall(r"`(?:engine\.)?([A-Za-z_][A-Za-z0-9_]*)", text))
    public = [name for name in dir(Engine) if not name.startswith("_")]
    missing = [name for name in public if name not in documented]
    assert not missing, f"Engine members missing from docs/engine.md: {missing}"
