"""``Trainer(compile=True)`` on a module without ``forward`` (the README's ``Classifier``: its steps call
``self.net(x)``): the submodules the steps call are compiled, training equals eager, checkpoint keys are plain."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import quiet_trainer
from trainer import TrainModule
from trainer.strategies.speed.compile import CompiledForward, is_compiled


class Classifier(TrainModule):
    """The README's module, smaller, with SGD so that the comparison is of the forward and backward only."""

    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=generator)
    return DataLoader(TensorDataset(x, torch.randint(0, 3, (32,), generator=generator)), batch_size=8)


def fit(compile_option) -> Classifier:
    torch.manual_seed(0)
    module = Classifier()
    quiet_trainer(compile=compile_option, max_epochs=2).fit(module, data(), data())
    return module


def test_compile_true_compiles_what_the_steps_of_a_module_without_forward_call():
    eager = fit(False)
    compiled = fit(True)
    assert is_compiled(compiled) and isinstance(compiled.net.__dict__["forward"], CompiledForward)
    assert "forward" not in compiled.__dict__  # the module itself has nothing to compile
    assert list(compiled.state_dict()) == list(eager.state_dict()) == ["net.0.weight", "net.0.bias", "net.2.weight",
                                                                       "net.2.bias"]  # fmt: skip
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], value, rtol=0, atol=1e-5)
