"""``strategy="model_parallel"``: device maps (automatic under a memory budget, explicit, invalid), training across
"devices" that are all the CPU equals one device exactly, and the memory planner's per-device bytes equal the
tensors the strategy placed. Running layers on several GPUs is checked only where two GPUs exist."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer.callbacks import Callback
from trainer.strategies import ConfigurationError, ModelParallelStrategy
from trainer.strategies.nd.device_map import plan_device_map, resolve_device_map, tensor_devices
from tests.helpers import quiet_trainer, regression_data
from trainer import TrainModule
from trainer.memory.planner import estimate


class Seq2Seq(TrainModule):
    """An encoder and a decoder, the split this strategy is made for."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16))
        self.decoder = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def layers(count: int, width: int = 10) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(count)])  # 440 bytes each


# ---------------------------------------------------------------------------------------------- device maps
def test_auto_map_fills_devices_in_order_with_equal_shares():
    assert plan_device_map(layers(4), [0, 1]) == {"0": 0, "1": 0, "2": 1, "3": 1}
    assert plan_device_map(layers(6), [0, 1, 2]) == {"0": 0, "1": 0, "2": 1, "3": 1, "4": 2, "5": 2}


def test_auto_map_splits_a_module_larger_than_a_share_but_keeps_no_split_classes_whole():
    model = nn.Module()
    model.encoder, model.decoder = layers(3), layers(1)  # 1320 and 440 bytes
    assert plan_device_map(model, [0, 1]) == {"encoder.0": 0, "encoder.1": 0, "encoder.2": 1, "decoder": 1}
    assert plan_device_map(model, [0, 1], no_split=(nn.Sequential,)) == {"encoder": 0, "decoder": 1}


def test_budget_moves_layers_on_and_names_the_layer_that_fits_nowhere():
    # 4 layers of 440 bytes, budget 900 bytes per device: two per device whatever the shares say.
    assert plan_device_map(layers(4), [0, 1], max_memory="900B") == {"0": 0, "1": 0, "2": 1, "3": 1}
    assert plan_device_map(layers(3), [0, 1], max_memory=[500, None]) == {"0": 0, "1": 1, "2": 1}
    with pytest.raises(ConfigurationError, match=r"'0' needs 440 B .*max_memory"):
        plan_device_map(layers(2), [0, 1], max_memory=400)
    with pytest.raises(ConfigurationError, match=r"'2' needs 440 B"):  # the total does not fit: the third layer
        plan_device_map(layers(3), [0, 1], max_memory=500)


def test_explicit_map_is_checked_against_the_module_and_the_devices():
    module = Seq2Seq()
    cpu = [torch.device("cpu")] * 2
    with pytest.raises(ConfigurationError, match=r"'decodr'.*\['encoder', 'decoder'\]"):
        resolve_device_map(module, {"encoder": 0, "decodr": 1}, cpu)
    with pytest.raises(ConfigurationError, match="not one of the devices in use"):
        resolve_device_map(module, {"encoder": 0, "decoder": 5}, cpu)
    with pytest.raises(ConfigurationError, match=r"does not place \['decoder.0.weight'"):
        tensor_devices(module, {"encoder": 0})
    tied = Seq2Seq()
    tied.decoder[0].weight = tied.encoder[2].weight
    with pytest.raises(ConfigurationError, match="same tensor"):
        tensor_devices(tied, {"encoder": 0, "decoder": 1})
    with pytest.raises(ConfigurationError, match="'auto' or a dict"):
        ModelParallelStrategy(device_map="balanced")


# ---------------------------------------------------------------------------------------------- training
class TensorBytes(Callback):
    """Bytes of parameters, gradients and optimizer state per device index, just before zero_grad."""

    def __init__(self) -> None:
        self.per_device: dict[int, list[int]] = {}

    def on_before_zero_grad(self, trainer, module, optimizer):
        if any(param.grad is None for param in module.parameters()):
            return  # the fit's first zero_grad (Lightning's order: before the first backward) has no gradients yet
        slot = tensor_devices(module, trainer.strategy.device_map)
        totals = {index: [0, 0, 0] for index in set(slot.values())}
        for name, param in module.named_parameters():
            nbytes = param.numel() * param.element_size()
            totals[slot[name]][0] += nbytes
            totals[slot[name]][1] += param.grad.numel() * param.grad.element_size()
            state = optimizer.state[param].values()
            totals[slot[name]][2] += sum(t.numel() * t.element_size() for t in state if isinstance(t, torch.Tensor))
        self.per_device = totals


def fit(strategy, devices: int, callbacks=()):
    torch.manual_seed(0)
    module = Seq2Seq()
    trainer = quiet_trainer(strategy=strategy, devices=devices, max_epochs=2, num_sanity_val_steps=0,
                            callbacks=list(callbacks))  # fmt: skip
    data = DataLoader(regression_data(32), batch_size=8, shuffle=True)
    trainer.fit(module, data, DataLoader(regression_data(16, seed=1), batch_size=8))
    return trainer, module


@pytest.mark.parametrize("device_map", ["auto", {"encoder": 0, "decoder": 1}], ids=["auto", "encoder-decoder"])
def test_cpu_devices_train_exactly_like_one_device(device_map):
    _, single = fit("single_device", 1)
    probe = TensorBytes()
    trainer, split = fit(ModelParallelStrategy(device_map=device_map), 2, [probe])
    assert set(trainer.strategy.device_map.values()) == {0, 1}  # both devices hold layers
    for key, value in single.state_dict().items():
        assert torch.equal(value, split.state_dict()[key]), key
    # The planner's bytes per device are the bytes of the tensors placed there.
    plan = estimate(Seq2Seq(), strategy="model_parallel", world_size=2, optimizer="adam", device_map=device_map)
    for index, device in enumerate(plan.devices):
        assert [device.parameters, device.gradients, device.optimizer_state] == probe.per_device[index]


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs to place layers on different devices")
def test_layers_run_on_their_gpus():
    torch.manual_seed(0)
    module = Seq2Seq()
    trainer = quiet_trainer(accelerator="gpu", devices=2, strategy=ModelParallelStrategy({"encoder": 0, "decoder": 1}),
                            max_steps=2)  # fmt: skip
    trainer.fit(module, DataLoader(regression_data(32), batch_size=8))
    assert module.encoder[0].weight.device == torch.device("cuda", 0)
    assert module.decoder[0].weight.device == torch.device("cuda", 1)
    assert module(torch.randn(2, 4, device="cuda:0")).device == torch.device("cuda", 0)  # output back on the first
