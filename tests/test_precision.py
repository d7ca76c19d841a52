"""Precision plugins end to end: real fits on tiny models, real checkpoint files.

CPU runs always; the same tests run on CUDA (float16 autocast and GradScaler on cuda) when a GPU is
visible. 16-mixed tests pass an explicit GradScaler with a small initial scale so that the only
skipped step is the one the test injects (the default 2**16 overflows during its first steps,
which is normal calibration but would blur "exactly that step").
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.strategies import ConfigurationError, DoublePrecision, HalfPrecision, MixedPrecision, Precision
from trainer.strategies.precision import precision_plugin
from trainer import Trainer, TrainModule

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA GPU visible: the cuda autocast/GradScaler path needs one")]),
]  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)


def _loader(n: int = 32, batch_size: int = 8, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[0.5], [-1.0], [0.25], [2.0]]) + 0.05 * torch.randn(n, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def _trainer(device: str = "cpu", **kwargs: Any) -> Trainer:
    options = dict(accelerator=device, devices=1, enable_progress_bar=False, enable_model_summary=False,
                   logger=False, enable_checkpointing=False)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)


def _fp16(device: str, scaler: Optional[torch.amp.GradScaler] = None) -> MixedPrecision:
    return MixedPrecision("16-mixed", scaler=scaler or torch.amp.GradScaler(device, init_scale=2.0**8))


class CountingScaler(torch.amp.GradScaler):
    """A real GradScaler that counts its unscale_ calls (GradScaler.step's own included)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unscale_calls = 0

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.unscale_calls += 1
        super().unscale_(optimizer)


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients each real step was taken with (skipped steps never call it)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure: Any = None) -> Any:
        self.seen.append([p.grad.detach().clone() for group in self.param_groups for p in group["params"]])
        return super().step(closure)


class Net(TrainModule):
    """4-8-1 MLP on a linear target. Records dtypes, losses, scales, weights and gradients around each step."""

    def __init__(self, lr: float = 0.1, inf_at_step: Optional[int] = None, scheduler: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.lr = lr
        self.inf_at_step = inf_at_step
        self.scheduler = scheduler
        self.seen: dict[str, list[Any]] = {key: [] for key in (
            "activation", "param", "input", "target", "new_tensor", "loss", "scale", "before", "after",
            "scaled", "hook_grads")}  # fmt: skip

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        hidden = self.net[0](x)
        self.seen["activation"].append(hidden.dtype)
        self.seen["param"].append(self.net[0].weight.dtype)
        self.seen["input"].append(x.dtype)
        self.seen["target"].append(y.dtype)
        self.seen["new_tensor"].append(torch.zeros(1).dtype)
        loss = nn.functional.mse_loss(self.net[2](self.net[1](hidden)), y)
        self.seen["loss"].append(loss.detach().float())
        return loss

    def _scaler(self) -> Optional[torch.amp.GradScaler]:
        return getattr(self.trainer.strategy.precision, "scaler", None)

    def on_after_backward(self) -> None:
        if self.global_step == self.inf_at_step:
            self.net[0].weight.grad[0, 0] = float("inf")
        scaler = self._scaler()  # the latest micro-batch's: at the window end it holds the accumulated sum
        self.seen["scaled"] = [[p.grad.clone() for p in self.parameters()], scaler.get_scale() if scaler else 1.0]

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads, scale = self.seen["scaled"]
        self.seen["hook_grads"].append(([p.grad.clone() for p in self.parameters()], grads, scale))
        self.seen["before"].append([p.detach().clone() for p in self.parameters()])

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen["after"].append([p.detach().clone() for p in self.parameters()])
        scaler = self._scaler()
        self.seen["scale"].append(scaler.get_scale() if scaler else None)

    def configure_optimizers(self) -> Any:
        optimizer = RecordingSGD(self.parameters(), lr=self.lr)
        if not self.scheduler:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _expected_clip(grads: list[torch.Tensor], clip_val: float, algorithm: str) -> list[torch.Tensor]:
    if algorithm == "value":
        return [g.clamp(-clip_val, clip_val) for g in grads]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert total > clip_val, "clipping must be active for this check to mean anything"
    return [g * (clip_val / (total + 1e-6)) for g in grads]


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------- mixed modes
@pytest.mark.parametrize("device", DEVICES)
def test_bf16_mixed_autocasts_activations_keeps_float32_weights_and_learns(device):
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("this GPU has no native bfloat16")
    torch.manual_seed(0)
    model = Net()
    trainer = _trainer(device, precision="bf16-mixed", max_epochs=5)
    trainer.fit(model, _loader())

    assert trainer.strategy.precision.scaler is None  # bf16 has float32's range: no loss scaling
    assert set(model.seen["activation"]) == {torch.bfloat16}
    assert set(model.seen["param"]) == {torch.float32}
    assert all(p.dtype is torch.float32 and p.device.type == device for p in model.parameters())
    losses = model.seen["loss"]
    assert losses[-1] < losses[0] / 10


@pytest.mark.parametrize("device", DEVICES)
def test_16_mixed_inf_gradient_skips_exactly_that_step(device):
    torch.manual_seed(0)
    model = Net(inf_at_step=2, scheduler=True)
    plugin = _fp16(device)
    trainer = _trainer(device, precision=plugin, max_steps=6, log_every_n_steps=1)
    trainer.fit(model, _loader(n=48))

    assert set(model.seen["activation"]) == {torch.float16}
    assert set(model.seen["param"]) == {torch.float32}  # master weights stay float32
    before, after = model.seen["before"], model.seen["after"]
    for step in range(6):
        unchanged = all(torch.equal(b, a) for b, a in zip(before[step], after[step]))
        assert unchanged == (step == 2), f"step {step}"
    scales = model.seen["scale"]
    assert scales[2] == scales[1] * plugin.scaler.get_backoff_factor()
    assert trainer.global_step == 6  # training continued after the skip
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert model.seen["loss"][-1] < model.seen["loss"][0]

    assert trainer.skipped_steps == 1
    assert trainer.progress_bar_metrics["skipped_steps"] == 1
    assert trainer.logged_metrics["skipped_steps"] == 1
    optimizer = trainer.optimizers[0]
    assert len(optimizer.seen) == 5
    scheduler = trainer.lr_schedulers[0]
    assert scheduler.last_epoch == 5  # stepped after the 5 real steps, not after the skipped one
    assert optimizer.param_groups[0]["lr"] == pytest.approx(model.lr * 0.5**5)


@pytest.mark.parametrize("device", DEVICES)
def test_16_mixed_hook_sees_unscaled_gradients_unscaled_once_with_accumulation(device):
    torch.manual_seed(0)
    model = Net()
    scaler = CountingScaler(device, init_scale=2.0**8)
    trainer = _trainer(device, precision=_fp16(device, scaler), max_epochs=1, accumulate_grad_batches=3,
                       gradient_clip_val=0.01)  # fmt: skip
    trainer.fit(model, _loader(n=48))  # 6 micro-batches → 2 optimizer steps

    assert trainer.global_step == 2 and trainer.skipped_steps == 0
    assert scaler.unscale_calls == 2  # once per step, though clipping also asks for unscaling
    for hook_grads, accumulated_scaled, scale in model.seen["hook_grads"]:
        assert scale > 1
        assert _close(hook_grads, [g / scale for g in accumulated_scaled])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_16_mixed_clipping_acts_on_unscaled_gradients(device, algorithm):
    torch.manual_seed(0)
    model = Net()
    clip_val = 0.05
    trainer = _trainer(device, precision=_fp16(device), max_steps=3, gradient_clip_val=clip_val,
                       gradient_clip_algorithm=algorithm)  # fmt: skip
    trainer.fit(model, _loader())

    stepped_with = trainer.optimizers[0].seen
    assert len(stepped_with) == 3
    for (hook_grads, scaled, scale), used in zip(model.seen["hook_grads"], stepped_with):
        unscaled = [g / scale for g in scaled]
        assert _close(hook_grads, unscaled)  # the hook ran before clipping, on true gradients
        assert _close(used, _expected_clip(unscaled, clip_val, algorithm))


# ---------------------------------------------------------------------------------------------- manual optimisation
class ManualNet(Net):
    """Manual optimisation: manual_backward → clip_gradients → optimizer.step(), all through the plugin."""

    def __init__(self, clip_val: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.clip_val = clip_val

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        self.clip_gradients(optimizer, self.clip_val, "norm")
        optimizer.step()


@pytest.mark.parametrize("device", DEVICES)
def test_manual_optimisation_goes_through_the_plugin(device):
    torch.manual_seed(0)
    model = ManualNet(clip_val=0.05, inf_at_step=1)
    scaler = CountingScaler(device, init_scale=2.0**8)
    trainer = _trainer(device, precision=_fp16(device, scaler), max_epochs=1)
    trainer.fit(model, _loader())  # 4 batches, one step each; the second gets an inf gradient

    assert trainer.global_step == 4 and trainer.skipped_steps == 1
    assert scaler.unscale_calls == 4  # clip_gradients unscaled; optimizer.step() did not unscale again
    assert scaler.get_scale() == 2.0**8 * scaler.get_backoff_factor()
    assert set(model.seen["activation"]) == {torch.float16}
    used = trainer.optimizers[0].seen
    assert len(used) == 3  # the skipped step never reached the optimizer
    real_steps = [entry for step, entry in enumerate(model.seen["hook_grads"]) if step != 1]
    for (hook_grads, scaled, scale), stepped in zip(real_steps, used):
        expected = _expected_clip([g / scale for g in scaled], model.clip_val, "norm")
        assert _close(hook_grads, expected)  # here the user clipped before step(), so the hook sees that
        assert _close(stepped, expected)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------------------------------------- true precisions
class DictNet(Net):
    """Batches are dicts holding an integer tensor too: only floating tensors may be converted."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert batch["index"].dtype is torch.int64
        return super().training_step((batch["x"], batch["y"]), batch_idx)


def _dict_loader() -> DataLoader:
    dataset = _loader().dataset
    items = [{"x": x, "y": y, "index": torch.tensor(i)} for i, (x, y) in enumerate(dataset)]
    return DataLoader(items, batch_size=8)


@pytest.mark.parametrize("device", DEVICES)
def test_64_true_parameters_inputs_and_new_tensors_are_float64(device):
    torch.manual_seed(0)
    model = DictNet()
    trainer = _trainer(device, precision=64, max_epochs=2)
    trainer.fit(model, _dict_loader())

    assert {*model.seen["param"], *model.seen["input"], *model.seen["target"], *model.seen["new_tensor"]} == {torch.float64}
    assert all(p.dtype is torch.float64 for p in model.parameters())
    assert torch.get_default_dtype() is torch.float32  # restored outside the steps
    assert model.seen["loss"][-1] < model.seen["loss"][0]


@pytest.mark.parametrize("spelling, dtype", [("16-true", torch.float16), ("bf16-true", torch.bfloat16)])
def test_true_half_converts_weights_inputs_and_optimizer_state_and_warns_once(spelling, dtype):
    class MomentumNet(Net):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.seen["input"].append(batch[0].dtype)

    torch.manual_seed(0)
    model = MomentumNet()
    trainer = _trainer(precision=spelling, max_epochs=2, num_sanity_val_steps=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, _loader(), _loader(n=8))
        trainer.validate(model, _loader(n=8), verbose=False)
    about_state = [w for w in caught if "optimizer state" in str(w.message)]
    assert len(about_state) == 1 and spelling.replace("-true", "-mixed") in str(about_state[0].message)
    assert {*model.seen["param"], *model.seen["input"], *model.seen["activation"]} == {dtype}
    state = trainer.optimizers[0].state[next(model.parameters())]
    assert state["momentum_buffer"].dtype is dtype
    assert model.seen["loss"][-1] < model.seen["loss"][0]


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("device", DEVICES)
def test_resume_restores_the_scaler_state(device, tmp_path):
    torch.manual_seed(0)
    first = Net(inf_at_step=1)
    trainer = _trainer(device, precision=_fp16(device), max_steps=3)
    trainer.fit(first, _loader())
    saved_scale = trainer.strategy.precision.scaler.get_scale()
    assert saved_scale != torch.amp.GradScaler(device).get_scale()  # differs from a fresh scaler's default
    path = tmp_path / "fp16.ckpt"
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=True)["precision"]["scaler"]["scale"] == saved_scale

    class ScaleAtStart(Net):
        def on_train_start(self) -> None:
            self.seen["scale_at_start"] = self.trainer.strategy.precision.scaler.get_scale()

    second = ScaleAtStart()
    resumed = _trainer(device, precision="16-mixed", max_steps=4)
    resumed.fit(second, _loader(), ckpt_path=path)
    assert second.seen["scale_at_start"] == saved_scale
    assert resumed.skipped_steps >= 1 and resumed.global_step == 4


# ---------------------------------------------------------------------------------------------- spellings and bad input
SPELLINGS = [
    ("32-true", Precision, "32-true"), ("32", Precision, "32-true"), (32, Precision, "32-true"),
    ("64-true", DoublePrecision, "64-true"), ("64", DoublePrecision, "64-true"), (64, DoublePrecision, "64-true"),
    ("16-mixed", MixedPrecision, "16-mixed"), ("16", MixedPrecision, "16-mixed"), (16, MixedPrecision, "16-mixed"),
    ("bf16-mixed", MixedPrecision, "bf16-mixed"), ("bf16", MixedPrecision, "bf16-mixed"),
    ("16-true", HalfPrecision, "16-true"), ("bf16-true", HalfPrecision, "bf16-true"),
]  # fmt: skip
_DTYPES = {"32-true": None, "64-true": None, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16,
           "16-true": torch.float16, "bf16-true": torch.bfloat16}  # fmt: skip


@pytest.mark.parametrize("spelling, cls, name", SPELLINGS)
def test_every_spelling_maps_to_its_plugin(spelling, cls, name):
    trainer = _trainer(precision=spelling)
    plugin = trainer.strategy.precision
    assert type(plugin) is cls and plugin.name == name and trainer.precision == name
    assert getattr(plugin, "dtype", None) == _DTYPES[name]


@pytest.mark.parametrize("bad", ["fp16", "16-MIXED", "bf16-true-ish", 16.0, True, None, "mixed"])
def test_unknown_precision_lists_every_valid_spelling(bad):
    with pytest.raises(ConfigurationError) as info:
        _trainer(precision=bad)
    message = str(info.value)
    assert repr(bad) in message
    for spelling, _, _ in SPELLINGS:
        assert repr(spelling) in message


def test_a_scaler_with_bf16_is_refused():
    with pytest.raises(ConfigurationError, match="bfloat16.*needs no loss scaling"):
        MixedPrecision("bf16-mixed", scaler=torch.amp.GradScaler("cpu"))


def test_a_scaler_for_another_device_type_fails_before_training():
    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GradScaler("cuda") on a machine without CUDA warns and disables itself
        scaler = torch.amp.GradScaler("cuda")
    trainer = _trainer("cpu", precision=MixedPrecision("16-mixed", scaler=scaler), max_steps=1)
    with pytest.raises(ConfigurationError, match="built for 'cuda'.*runs on 'cpu'"):
        trainer.fit(model, _loader())
    assert model.seen["loss"] == []


def test_64_true_on_mps_fails_before_training():
    with pytest.raises(ConfigurationError, match="64-true.*MPS"):
        DoublePrecision().setup(torch.device("mps"))


@pytest.mark.parametrize("plugin", [MixedPrecision("bf16-mixed"), HalfPrecision("bf16-true")], ids=repr)
def test_bf16_on_a_gpu_without_bf16_fails_before_training(plugin, monkeypatch):
    # No pre-Ampere GPU here: report the capability of one (a T4, compute capability 7.5).
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(ConfigurationError, match=r"needs bfloat16, which Tesla T4 does not support.*'16-mixed'"):
        plugin.setup(torch.device("cuda", 0))


def test_a_plugin_instance_is_used_as_given():
    plugin = _fp16("cpu")
    assert precision_plugin(plugin) is plugin
    assert _trainer(precision=plugin).strategy.precision is plugin


class _RecordingPrecision(Precision):
    """A user's own plugin: full precision, but every per-step method it overrides records its call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def forward_context(self):
        self.calls.append("forward_context")
        return super().forward_context()

    def backward(self, loss, *args, **kwargs):
        self.calls.append("backward")
        super().backward(loss, *args, **kwargs)

    def unscale_gradients(self, optimizer):
        self.calls.append("unscale_gradients")


def test_a_user_plugin_overriding_the_step_methods_is_called_every_step():
    # The base plugin's no-op layers are skipped on the per-step path; an override must never be.
    assert Precision.plain_forward and Precision.plain_backward and Precision.plain_unscale
    assert not MixedPrecision.plain_forward and not MixedPrecision.plain_backward
    plugin = _RecordingPrecision()
    assert not (plugin.plain_forward or plugin.plain_backward or plugin.plain_unscale)
    _trainer(precision=plugin, max_steps=3).fit(Net(), _loader())
    for name in ("forward_context", "backward", "unscale_gradients"):
        assert plugin.calls.count(name) == 3, (name, plugin.calls)
