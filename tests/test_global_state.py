"""What a fit sets process-wide is put back after it: deterministic algorithms, cuDNN flags, the default dtype; and
a module converted by one precision is converted back for a later fit whose precision keeps modules as built."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from trainer.callbacks import Callback
from trainer.module.precision_dtype import undo_earlier_conversion
from trainer.strategies.precision.plugins import Precision
from ckpt_support import TinyRegressor, loaders, make_trainer


class FlagsDuringFit(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        cudnn = torch.backends.cudnn
        self.seen = (torch.are_deterministic_algorithms_enabled(), cudnn.deterministic, cudnn.benchmark,
                     os.environ.get("CUBLAS_WORKSPACE_CONFIG"))  # fmt: skip


def flags() -> tuple:
    cudnn = torch.backends.cudnn
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            cudnn.deterministic, cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))  # fmt: skip


def test_deterministic_and_benchmark_hold_during_the_fit_only(tmp_path: Path) -> None:
    before = flags()
    assert before[0] is False  # the test process starts without them
    seen = FlagsDuringFit()
    trainer = make_trainer(tmp_path, deterministic=True, callbacks=[seen], enable_checkpointing=False)
    assert flags() == before  # building a Trainer changes nothing yet
    trainer.fit(TinyRegressor(), *loaders())
    assert seen.seen == (True, True, False, before[4] or ":4096:8")
    assert flags() == before  # put back after the fit
    later = FlagsDuringFit()
    make_trainer(tmp_path, callbacks=[later], enable_checkpointing=False).fit(TinyRegressor(), *loaders())
    assert later.seen[:2] == (False, before[2])  # a later Trainer does not inherit them

    make_trainer(tmp_path, benchmark=True, callbacks=[seen], enable_checkpointing=False).fit(TinyRegressor(), *loaders())
    assert seen.seen[2] is True and flags() == before


def test_a_module_fitted_in_64_true_is_converted_back_for_a_32_true_fit(tmp_path: Path) -> None:
    module = TinyRegressor()
    make_trainer(tmp_path, precision="64-true", enable_checkpointing=False).fit(module, *loaders())
    assert module.net[0].weight.dtype is torch.float64  # what the 64-true fit trained, left as it is after it
    assert torch.get_default_dtype() is torch.float32
    trainer = make_trainer(tmp_path, precision="32-true", enable_checkpointing=False, max_epochs=3)
    trainer.fit(module, *loaders())  # float64 weights, float32 batches: would fail with torch's dtype mismatch
    assert trainer.global_step == 12 and module.net[0].weight.dtype is torch.float32


def test_a_module_the_user_built_in_float64_is_left_alone() -> None:
    module = TinyRegressor().double()
    assert undo_earlier_conversion(module, Precision()) is torch.float64
    assert module.net[0].weight.dtype is torch.float64
