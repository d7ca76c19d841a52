"""Several training dataloaders, combined as Lightning's CombinedLoader does: the four modes step by step, lists
and dicts wrapped automatically, two DDP ranks with a distributed sampler in each loader, and a fit killed
mid-epoch that resumes to the same weights. Whatever cannot yield batches is an error.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.strategies import ConfigurationError
from test_ddp_processes import Job, clean_env
from test_resume_exact import KILLED, SCRIPT as RESUMABLE, assert_same_weights, run_here
from trainer import CombinedLoader, Trainer, TrainModule

DDP_SCRIPT = Path(__file__).parent / "scripts" / "combined_ddp.py"
spec = importlib.util.spec_from_file_location("combined_ddp", DDP_SCRIPT)
combined_ddp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(combined_ddp)


def numbered(n: int, start: int = 0, batch_size: int = 1) -> DataLoader:
    """A loader whose batch k holds the number start + k (batch_size 1)."""
    return DataLoader(TensorDataset(torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1)), batch_size=batch_size)


class Seen(TrainModule):
    """Records what each ``training_step(self, batch)`` got, as plain numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.steps: list = []

    def training_step(self, batch):
        self.steps.append(_plain(batch))
        return self.weight.sum() * 0 + self.weight.pow(2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _plain(batch):
    if batch is None:
        return None
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (list, tuple)):
        return [_plain(b) for b in batch]
    return int(batch[0].item())


def fit_steps(data, **kwargs) -> tuple[Trainer, list]:
    module = Seen()
    options = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, max_epochs=1)  # fmt: skip
    trainer = Trainer(**{**options, **kwargs})
    trainer.fit(module, data)
    return trainer, module.steps


# ---------------------------------------------------------------------------------------------- the four modes
def test_a_list_or_dict_of_loaders_trains_on_a_batch_of_each_per_step_cycling_the_shorter():
    trainer, steps = fit_steps([numbered(4), numbered(2, start=10)])
    assert steps == [[0, 10], [1, 11], [2, 10], [3, 11]] and trainer.global_step == 4  # not 2 "steps" of loaders
    _, steps = fit_steps({"a": numbered(3), "b": numbered(2, start=10)})
    assert steps == [{"a": 0, "b": 10}, {"a": 1, "b": 11}, {"a": 2, "b": 10}]


@pytest.mark.parametrize("mode, expected", [
    ("max_size_cycle", [[0, 10], [1, 11], [2, 10]]),
    ("min_size", [[0, 10], [1, 11]]),
    ("max_size", [[0, 10], [1, 11], [2, None]]),
    ("sequential", [0, 1, 2, 10, 11]),
])  # fmt: skip
def test_each_mode_gives_the_steps_lightning_gives(mode, expected):
    combined = CombinedLoader([numbered(3), numbered(2, start=10)], mode)
    trainer, steps = fit_steps(combined, max_epochs=2)
    assert steps == expected * 2 and len(combined) == len(expected) and trainer.num_training_batches == len(expected)
    indices = [(batch_idx, loader_idx) for _, batch_idx, loader_idx in combined]
    if mode == "sequential":  # iterating one yourself: (batch, batch_idx, dataloader_idx) as in Lightning
        assert indices == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]
    else:
        assert indices == [(i, 0) for i in range(len(expected))]


def test_evaluation_takes_a_dict_of_loaders_and_refuses_what_is_not_batches():
    class Evaluated(Seen):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.steps.append((dataloader_idx, _plain(batch)))

    module = Evaluated()
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer.validate(module, {"x": numbered(2), "y": numbered(1, start=5)}, verbose=False)
    assert module.steps == [(0, 0), (0, 1), (1, 5)]
    module.steps.clear()  # another mode: each step gets a batch of every loader, without dataloader_idx (Lightning)
    trainer.validate(module, CombinedLoader([numbered(2), numbered(1, start=5)], "min_size"), verbose=False)
    assert module.steps == [(0, [0, 5])]
    bad = [
        (torch.randn(4, 2), "got Tensor. Wrap tensors in a TensorDataset and a DataLoader"),
        ({"a": numbered(2), "b": torch.randn(3)}, "entry 'b' is a Tensor, which does not yield batches"),
        ([numbered(2), 5], "entry 1 is a int"),
        (TensorDataset(torch.randn(4, 2)), "got TensorDataset. Wrap a Dataset in a DataLoader"),
    ]
    for data, message in bad:
        with pytest.raises(ConfigurationError, match=message):
            fit_steps(data)
    with pytest.raises(ConfigurationError, match=r"mode='zip'\) is not a mode"):
        CombinedLoader([numbered(2)], "zip")


# ---------------------------------------------------------------------------------------------- DDP
@pytest.fixture(scope="module")
def ddp_reports(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("combined_ddp")
    return Job(out, [([sys.executable, str(DDP_SCRIPT), str(out)], clean_env())]).run().check_ok()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", combined_ddp.MODES)
def test_two_ddp_ranks_split_every_loader_and_train_like_one_process_with_double_batch(ddp_reports, mode):
    trainer, one = combined_ddp.fit(mode, devices=1, batch=4)
    rank0, rank1 = (report[mode] for report in ddp_reports)
    assert rank0["global_step"] == rank1["global_step"] == trainer.global_step
    for step, (a, b, whole) in enumerate(zip(rank0["seen"], rank1["seen"], one.seen)):
        for key, ids in whole.items():  # each rank got its own half of every loader's batch
            if ids is None:
                assert a[key] is None and b[key] is None, (mode, step, key)
            else:
                assert not set(a[key]) & set(b[key]) and sorted(a[key] + b[key]) == sorted(ids), (mode, step, key)
    for key, value in one.state_dict().items():
        torch.testing.assert_close(rank0["weights"][key], value, rtol=0, atol=1e-6)
        assert torch.equal(rank0["weights"][key], rank1["weights"][key])


# ---------------------------------------------------------------------------------------------- exact resume
KILL_AT = {"max_size_cycle": 19, "min_size": 11, "max_size": 19, "sequential": 13}


@pytest.mark.parametrize("mode", list(KILL_AT))
def test_a_fit_on_combined_loaders_killed_mid_epoch_resumes_to_the_same_weights(tmp_path, mode):
    """Shuffled loaders of 10 and 6 batches, accumulation 3 (a checkpoint at every step), validation inside epochs.
    The checkpoints resumed from: epoch 1 batch 9, the short loader 3 batches into its second pass
    (max_size_cycle); epoch 1 batch 3 (min_size); epoch 1 batch 9, the short loader finished (max_size); batch 12,
    2 batches into the second loader (sequential)."""
    run_here(tmp_path / "whole", tmp_path / "whole.pt", "--combined", mode)
    killed = subprocess.run([sys.executable, str(RESUMABLE), str(tmp_path / "run"), str(tmp_path / "run.pt"),
                             "--combined", mode, "--kill-batch", str(KILL_AT[mode])],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert killed.returncode == KILLED, killed.stderr[-3000:]
    run_here(tmp_path / "run", tmp_path / "run.pt", "--combined", mode, "--resume")
    assert_same_weights(tmp_path / "whole.pt", tmp_path / "run.pt")


def test_the_learning_rate_finder_steps_on_combined_batches_with_a_short_training_step():
    from trainer.callbacks import LearningRateFinder

    class Regression(Seen):
        def __init__(self):
            super().__init__()
            self.lr = 0.1
            self.layer = nn.Linear(1, 1)

        def training_step(self, batch):  # [batch_a, batch_b], no batch_idx
            self.steps.append(_plain(batch))
            return sum(nn.functional.mse_loss(self.layer(x), 2 * x) for (x,) in batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    module = Regression()
    finder = LearningRateFinder(num_training_steps=5, early_stop_threshold=None, update_attr=False)
    fit = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, max_epochs=1, callbacks=[finder])  # fmt: skip
    fit.fit(module, [numbered(3), numbered(2, start=10)])
    epoch = [[0, 10], [1, 11], [2, 10]]
    assert module.steps == epoch + epoch[:2] + epoch  # the finder's 5 trial steps (one epoch and more), then the fit
