"""Lightning's demos after the rename (``trainer.demos.boring_classes``): the shapes and outputs tests rely on."""
from __future__ import annotations

import torch

from trainer import Trainer
from trainer.core.optimizer import LightningOptimizer
from trainer.demos.boring_classes import (
    BoringDataModule,
    BoringModel,
    DemoModel,
    IterableBoringDataModule,
    ManualOptimBoringModel,
    RandomDataset,
    RandomDictDataset,
    RandomIterableDataset,
    RandomIterableDatasetWithLen,
)


def quiet(**kwargs) -> Trainer:
    return Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, **kwargs)  # fmt: skip


def test_datasets_have_lightnings_sizes():
    assert len(RandomDataset(32, 64)) == 64 and RandomDataset(32, 64)[0].shape == (32,)
    sample = RandomDictDataset(4, 3)[1]
    assert torch.equal(sample["b"], sample["a"] + 2)
    assert len(list(RandomIterableDataset(5, 7))) == 7
    assert len(RandomIterableDatasetWithLen(5, 7)) == 7


def test_boring_model_trains_validates_and_tests_with_its_step_outputs():
    model = BoringModel()
    outputs = {}

    class Watch(BoringModel):
        def on_validation_batch_end(self, out, batch, batch_idx, dataloader_idx=0):
            outputs["val"] = out

        def on_test_batch_end(self, out, batch, batch_idx, dataloader_idx=0):
            outputs["test"] = out

    model = Watch()
    before = model.layer.weight.detach().clone()
    trainer = quiet(max_epochs=1, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2)
    trainer.fit(model)
    assert trainer.global_step == 3 and not torch.equal(before, model.layer.weight)
    assert set(outputs["val"]) == {"x"}
    trainer.test(model)
    assert set(outputs["test"]) == {"y"}
    assert model(torch.randn(4, 32)).shape == (4, 2)
    assert len(model.train_dataloader()) == 64


def test_manual_and_demo_models_and_the_data_modules():
    manual = ManualOptimBoringModel()
    assert manual.automatic_optimization is False
    quiet(max_steps=2, limit_val_batches=0).fit(manual)
    assert isinstance(manual.optimizers(), LightningOptimizer)

    quiet(max_steps=2).fit(DemoModel(out_dim=3), datamodule=BoringDataModule())

    data = BoringDataModule()
    data.setup("fit")
    assert len(data.train_dataloader()) == 64 and len(data.val_dataloader()) == 64
    iterable = IterableBoringDataModule()
    iterable.setup("fit")
    assert len(iterable.train_dataloader()) == 2


def test_transformer_learns_wikitext2_from_a_local_text_file(tmp_path):
    """Fabric's language-model example after the rename: ``from trainer.demos import Transformer, WikiText2``."""
    import pytest
    from torch.nn import functional as F

    from trainer.demos import Transformer, WikiText2
    from trainer.fabric import Fabric

    with pytest.raises(ValueError, match="downloads nothing"):
        WikiText2(tmp_path)
    (tmp_path / "wikitext-2.txt").write_text("the cat sat on the mat\nthe dog sat on the log\n" * 20)
    data = WikiText2(tmp_path, block_size=6)
    assert data.vocab_size == 8 and len(data) == len(data.data) // 6 - 1  # 7 words and <eos>
    inputs, target = data[1]
    assert torch.equal(inputs[1:], target[:-1])
    fabric = Fabric(accelerator="cpu", devices=1)
    fabric.seed_everything(0)
    net = Transformer(vocab_size=data.vocab_size, ninp=16, nhead=2, nhid=16, nlayers=1, dropout=0.0)
    model, optimizer = fabric.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=4, shuffle=True))
    losses = []
    for _ in range(3):
        for inputs, target in loader:
            output = model(inputs, target)
            assert output.shape == (inputs.numel(), data.vocab_size)
            loss = F.nll_loss(output, target.view(-1))
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    assert losses[-1] < losses[0] / 2
