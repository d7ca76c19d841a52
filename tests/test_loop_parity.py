"""The Trainer computes exactly what the hand-written PyTorch loop it replaces computes."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers import loader, quiet_trainer
from trainer import TrainModule


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


class Wrapped(TrainModule):
    def __init__(self, net: nn.Module, make_optimizers) -> None:
        super().__init__()
        self.net = net
        self.make_optimizers = make_optimizers

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return self.make_optimizers(self.net.parameters())


def _assert_same_weights(a: nn.Module, b: nn.Module, atol: float) -> None:
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa, pb, atol=atol, rtol=0), f"{name} differs by {(pa - pb).abs().max().item()}"


def test_sgd_momentum_accumulation_with_partial_tail_clipping_and_epoch_steplr():
    data = loader(n=80, batch_size=8)  # 10 batches: windows of 4, 4 and a partial tail of 2
    epochs, accumulate, clip = 3, 4, 0.5

    def make(params):
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]

    reference = _mlp()
    module = Wrapped(copy.deepcopy(reference), make)
    [optimizer], [scheduler] = make(reference.parameters())
    steps = 0
    for _ in range(epochs):
        for i, (x, y) in enumerate(data):
            (nn.functional.mse_loss(reference(x), y) / accumulate).backward()
            if (i + 1) % accumulate == 0 or i + 1 == len(data):
                torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
        scheduler.step()

    trainer = quiet_trainer(max_epochs=epochs, accumulate_grad_batches=accumulate, gradient_clip_val=clip)
    trainer.fit(module, data)

    assert trainer.global_step == steps == 9
    assert trainer.lr_schedulers[0].get_last_lr() == scheduler.get_last_lr()
    _assert_same_weights(module.net, reference, atol=1e-6)


def test_adamw_with_per_step_scheduler():
    data = loader(n=48, batch_size=8)
    epochs = 2

    def make(params):
        optimizer = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    reference = _mlp()
    module = Wrapped(copy.deepcopy(reference), make)
    config = make(reference.parameters())
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    for _ in range(epochs):
        for x, y in data:
            nn.functional.mse_loss(reference(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()

    trainer = quiet_trainer(max_epochs=epochs)
    trainer.fit(module, data)

    assert trainer.global_step == 12
    assert trainer.lr_schedulers[0].last_epoch == scheduler.last_epoch == 12
    _assert_same_weights(module.net, reference, atol=1e-6)


@pytest.mark.parametrize("frequency", [1, 3])
def test_step_scheduler_frequency(frequency):
    def make(params):
        optimizer = torch.optim.SGD(params, lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": frequency}}

    module = Wrapped(_mlp(), make)
    trainer = quiet_trainer(max_steps=6)
    trainer.fit(module, loader(n=64, batch_size=8))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.5 ** (6 // frequency))


def test_reduce_lr_on_plateau_monitors_validation_metric():
    class Plateau(Wrapped):
        def validation_step(self, batch, batch_idx):
            self.log("val_metric", torch.tensor(1.0))  # never improves

    def make(params):
        optimizer = torch.optim.SGD(params, lr=1.0)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_metric"}}

    module = Plateau(_mlp(), make)
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(module, loader(), loader())
    # epoch 0 sets the best value; epochs 1 and 2 do not improve and each cut the LR by 10x
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01)


def test_max_steps_stops_mid_epoch_and_limit_train_batches():
    module = Wrapped(_mlp(), lambda p: torch.optim.SGD(p, lr=0.1))
    trainer = quiet_trainer(max_steps=5)
    trainer.fit(module, loader(n=64, batch_size=8))
    assert (trainer.global_step, trainer.current_epoch) == (5, 0)

    for limit, expected in ((3, 6), (0.5, 8)):
        module = Wrapped(_mlp(), lambda p: torch.optim.SGD(p, lr=0.1))
        trainer = quiet_trainer(max_epochs=2, limit_train_batches=limit)
        trainer.fit(module, loader(n=64, batch_size=8))
        assert trainer.global_step == expected, limit


def test_the_direct_step_and_the_layered_step_both_match_a_hand_written_loop():
    """With nothing between training_step and the torch calls the loop makes them itself; a callback hook in
    between puts the strategy/precision layers back. Both give the hand-written loop's weights."""
    from trainer.callbacks import Callback

    class Noop(Callback):
        def on_before_backward(self, trainer, module, loss):
            pass

    class RecordsOutputs(Callback):  # on_train_batch_end alone keeps the direct step; it gets {"loss": ...}
        def __init__(self) -> None:
            self.losses = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            assert not outputs["loss"].requires_grad
            self.losses.append(float(outputs["loss"]))

    data = loader(n=48, batch_size=8)

    def make(params):
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]

    reference = _mlp()
    [optimizer], [scheduler] = make(reference.parameters())
    losses = []
    for _ in range(2):
        for x, y in data:
            loss = nn.functional.mse_loss(reference(x), y)
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()

    recorder = RecordsOutputs()
    for callbacks, direct in (([], True), ([recorder], True), ([Noop(), RecordsOutputs()], False)):
        module = Wrapped(_mlp(), make)
        trainer = quiet_trainer(max_epochs=2, callbacks=callbacks)
        trainer.fit(module, data)
        assert trainer._optimization.plain is direct  # the path this case is meant to exercise
        assert trainer.global_step == 12
        _assert_same_weights(module.net, reference, atol=1e-6)
    assert recorder.losses == pytest.approx(losses, abs=1e-6)


def test_a_loader_without_length_ends_its_last_accumulation_window():
    """An iterable of unknown length: the loop looks one batch ahead to know the last one, so the partial window
    at the end still steps (10 batches, windows of 3: four steps)."""

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            torch.manual_seed(1)
            for _ in range(10):
                yield torch.randn(8, 4), torch.randn(8, 1)

    data = torch.utils.data.DataLoader(Stream(), batch_size=None)
    reference = _mlp()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = list(data)
    for i, (x, y) in enumerate(batches):
        (nn.functional.mse_loss(reference(x), y) / 3).backward()
        if (i + 1) % 3 == 0 or i + 1 == len(batches):
            optimizer.step()
            optimizer.zero_grad()

    module = Wrapped(_mlp(), lambda p: torch.optim.SGD(p, lr=0.1))
    trainer = quiet_trainer(max_epochs=1, accumulate_grad_batches=3)
    trainer.fit(module, data)
    assert trainer.global_step == 4
    _assert_same_weights(module.net, reference, atol=1e-6)
