"""A job started on Hugging Face Accelerate continues here after the import change: ``accelerator.load_state`` of
the folder Accelerate's ``save_state`` wrote. (Accelerate is not a dependency: the folder is written here in its
layout, file by file: ``model.safetensors``/``pytorch_model.bin``, ``optimizer.bin``, ``scheduler.bin``,
``random_states_0.pkl``.)"""
from __future__ import annotations

import random

import pytest
import torch

from trainer.accelerate import Accelerator
from trainer.strategies.errors import CheckpointError

np = pytest.importorskip("numpy", reason="Accelerate's random_states file holds NumPy's RNG state")


def _objects(accelerator: Accelerator, seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return accelerator.prepare(model, optimizer, scheduler)


def _write_like_accelerate(folder, model, optimizer, scheduler, safe: bool, rng_extra=None) -> None:
    folder.mkdir()
    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if safe:
        from safetensors.torch import save_file

        save_file(weights, str(folder / "model.safetensors"))
    else:
        torch.save(weights, folder / "pytorch_model.bin")
    torch.save(optimizer.optimizer.state_dict(), folder / "optimizer.bin")
    torch.save(scheduler.state_dict(), folder / "scheduler.bin")
    states = {"step": 0, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
              "torch_manual_seed": torch.get_rng_state()}  # fmt: skip
    if rng_extra is not None:
        states["extra"] = rng_extra
    torch.save(states, folder / "random_states_0.pkl")


class _Hostile:
    """Unpickling this would need arbitrary code: the restricted loader must refuse it."""


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_load_state_continues_a_folder_accelerates_save_state_wrote(tmp_path, safe):
    if safe:
        pytest.importorskip("safetensors", reason="Accelerate's default model file is safetensors")
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = _objects(accelerator, seed=0)
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    _write_like_accelerate(tmp_path / "ckpt", model, optimizer, scheduler, safe)
    expected_draw = torch.rand(3)

    resumed = Accelerator(cpu=True)
    new_model, new_optimizer, new_scheduler = _objects(resumed, seed=1)
    torch.manual_seed(99)
    resumed.load_state(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), new_model.state_dict().values()))
    momentum = [new_optimizer.state[p]["momentum_buffer"] for p in new_optimizer.param_groups[0]["params"]]
    assert all(torch.equal(a, optimizer.state[p]["momentum_buffer"])
               for a, p in zip(momentum, optimizer.param_groups[0]["params"]))  # fmt: skip
    assert new_scheduler.get_last_lr() == scheduler.get_last_lr() == [0.05]
    assert torch.equal(torch.rand(3), expected_draw)  # the saved torch RNG stream continues


def test_a_random_states_pickle_that_needs_code_is_refused_with_the_reason(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = _objects(accelerator, seed=0)
    _write_like_accelerate(tmp_path / "ckpt", model, optimizer, scheduler, safe=False, rng_extra=_Hostile())
    with pytest.warns(UserWarning, match="unpickling anything else could run code"):
        _load_into_new(tmp_path / "ckpt")


def _load_into_new(folder) -> None:
    accelerator = Accelerator(cpu=True)
    _objects(accelerator, seed=1)
    accelerator.load_state(folder)


def test_a_folder_with_other_objects_is_refused_naming_what_differs(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = _objects(accelerator, seed=0)
    _write_like_accelerate(tmp_path / "ckpt", model, optimizer, scheduler, safe=False)
    other = Accelerator(cpu=True)
    other.prepare(torch.nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match="1 optimizers saved, 0 prepared"):
        other.load_state(tmp_path / "ckpt")


def test_the_engine_points_an_accelerate_folder_to_the_accelerator(tmp_path):
    from trainer import Engine

    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = _objects(accelerator, seed=0)
    _write_like_accelerate(tmp_path / "ckpt", model, optimizer, scheduler, safe=False)
    engine = Engine(accelerator="cpu")
    engine.prepare(torch.nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match=r"Accelerate's save_state .*Accelerator\(\.\.\.\)\.load_state"):
        engine.load_state(tmp_path / "ckpt")
