"""A job trained and checkpointed by the REAL Hugging Face Accelerate continues here: ``accelerate.Accelerator``
``save_state``s (safetensors and ``safe_serialization=False``), then ``trainer.accelerate.Accelerator().load_state``
restores the same weights, optimizer, scheduler, registered objects and RNG as Accelerate's own ``load_state``, and the next steps'
losses equal Accelerate's continuation bitwise (CPU, deterministic)."""
from __future__ import annotations

import pytest
import torch

accelerate = pytest.importorskip("accelerate", reason="compares against the real Hugging Face Accelerate (extra 'peers')")
pytest.importorskip("numpy", reason="Accelerate's random_states file holds NumPy's RNG state")

import trainer.accelerate as ours  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Real Accelerate keeps one process-wide state; reset it so each Accelerator starts as in a new script."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


class Counter:
    """A user's object registered with ``register_for_checkpointing`` (Accelerate's ``custom_checkpoint_0.pkl``)."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


def _objects(accelerator, seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return accelerator.prepare(model, optimizer, scheduler)


def _train(accelerator, model, optimizer, scheduler, steps: int) -> list[torch.Tensor]:
    """Steps whose data and dropout masks come from torch's RNG, so the losses tell whether it was restored."""
    losses = []
    for _ in range(steps):
        x = torch.randn(6, 4)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.detach().clone())
    return losses


def _snapshot(model, optimizer, scheduler) -> dict:
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "lr": scheduler.get_last_lr(), "draw": torch.rand(5)}  # fmt: skip


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_a_real_accelerate_checkpoint_continues_here_as_on_accelerate(tmp_path, safe):
    from accelerate.state import AcceleratorState

    folder = tmp_path / "ckpt"
    real = accelerate.Accelerator(cpu=True)
    objects = _objects(real, seed=0)
    counter = Counter()
    real.register_for_checkpointing(counter)
    _train(real, *objects, steps=3)
    counter.seen = 3
    real.save_state(str(folder), safe_serialization=safe)
    assert (folder / ("model.safetensors" if safe else "pytorch_model.bin")).exists()

    AcceleratorState._reset_state(reset_partial_state=True)
    real = accelerate.Accelerator(cpu=True)
    objects = _objects(real, seed=1)
    real.register_for_checkpointing(Counter())
    torch.manual_seed(123)
    real.load_state(str(folder))
    expected = _snapshot(*objects)
    torch.manual_seed(123)  # undo the draw: the continuation starts at the restored stream
    real.load_state(str(folder))
    expected_losses = _train(real, *objects, steps=3)
    AcceleratorState._reset_state(reset_partial_state=True)

    mine = ours.Accelerator(cpu=True)
    objects = _objects(mine, seed=2)
    counter = Counter()
    mine.register_for_checkpointing(counter)
    torch.manual_seed(456)
    mine.load_state(folder)
    assert counter.seen == 3
    got = _snapshot(*objects)
    for key in ("weights", "optimizer", "lr", "draw"):
        assert _equal(got[key], expected[key]), f"{key} differs from what Accelerate's load_state restores"
    mine.load_state(folder)
    assert _equal(_train(mine, *objects, steps=3), expected_losses)


def test_several_models_and_optimizers_of_a_real_accelerate_checkpoint_load_in_their_order(tmp_path):
    """Accelerate numbers the files in prepare order (``model.safetensors``, ``model_1.safetensors``, ...)."""

    def prepared(accelerator, seed: int):
        torch.manual_seed(seed)
        student, teacher = torch.nn.Linear(4, 2), torch.nn.Linear(4, 3)
        return accelerator.prepare(student, teacher, torch.optim.Adam(student.parameters(), lr=0.1),
                                   torch.optim.SGD(teacher.parameters(), lr=0.1, momentum=0.9))  # fmt: skip

    real = accelerate.Accelerator(cpu=True)
    student, teacher, opt_s, opt_t = prepared(real, seed=0)
    x = torch.randn(5, 4)
    real.backward(student(x).sum() + teacher(x).sum())
    opt_s.step()
    opt_t.step()
    real.save_state(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "model_1.safetensors").exists() and (tmp_path / "ckpt" / "optimizer_1.bin").exists()

    mine = ours.Accelerator(cpu=True)
    objects = prepared(mine, seed=1)
    mine.load_state(tmp_path / "ckpt")
    for saved, loaded in zip((student, teacher), objects[:2]):
        assert _equal(loaded.state_dict(), saved.state_dict())
    for saved, loaded in zip((opt_s, opt_t), objects[2:]):
        assert _equal(loaded.state_dict(), saved.state_dict())
