"""Messages that say what happened: a skip on one rank only is a mismatched collective naming the rank, a rank
killed by a signal is reported as such, self.log during set-up, an ordinary "last" resume, and estimate-memory for a
class that needs constructor arguments."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from trainer.loops.skip_agreement import can_return_none
from trainer.strategies.launch.launchers.subprocess_script import how_it_ended
from ckpt_support import TinyRegressor, loaders, make_trainer

SCRIPT = Path(__file__).parent / "scripts" / "rank_one_misbehaves.py"
distributed = pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")


def run_job(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), mode], env=env, capture_output=True, text=True,
                          timeout=200)  # fmt: skip


@distributed
@pytest.mark.timeout(240)
def test_none_on_one_rank_only_is_named_as_a_mismatched_collective(tmp_path: Path) -> None:
    done = run_job(tmp_path, "one")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "training_step returned None on rank 1 only, at global step 3 (epoch 0, batch 3)" in output, output
    assert "mismatched collective" in output and "HangError" not in output and "train_timeout" not in output


@distributed
@pytest.mark.timeout(240)
def test_none_on_every_rank_skips_the_backward_together(tmp_path: Path) -> None:
    done = run_job(tmp_path, "all")
    assert done.returncode == 0, done.stdout + done.stderr
    # 8 batches per rank; the one both returned None for still takes its (empty) step together, as Lightning counts it
    assert "rank 0 finished at global step 8" in done.stdout and "rank 1 finished at global step 8" in done.stdout


@distributed
@pytest.mark.timeout(240)
def test_a_rank_killed_by_sigkill_is_reported_as_killed(tmp_path: Path) -> None:
    done = run_job(tmp_path, "kill")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "rank 1 was killed by SIGKILL (signal 9): no traceback" in output, output
    assert "its traceback is printed above" not in output


def test_how_a_rank_ended() -> None:
    assert how_it_ended(1, detail=True) == "exited with code 1 (its traceback is printed above)"
    assert "out-of-memory killer" in how_it_ended(-9, detail=True)
    assert how_it_ended(-6) == "was killed by SIGABRT (signal 6)"


def test_only_a_training_step_that_can_return_none_is_agreed_on() -> None:
    def always(self, batch):
        if batch:
            return 1
        else:
            raise ValueError

    def bare(self, batch):
        if batch:
            return
        return 1

    def falls_off(self, batch):
        if batch:
            return 1

    def explicit(self, batch):
        return None if batch else 1  # an expression: not seen, so not agreed on (documented)

    assert not can_return_none(always) and not can_return_none(TinyRegressor.training_step)
    assert can_return_none(bare) and can_return_none(falls_off)
    assert not can_return_none(explicit)


class LogsInConfigureOptimizers(TinyRegressor):
    def configure_optimizers(self):
        self.log("lr", 0.01)
        return super().configure_optimizers()


def test_self_log_in_configure_optimizers_says_where_it_was_called(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"self.log\('lr', ...\) was called while fit\(\) sets up .* log it from "
                                         r"on_train_start or a \*_step method instead") as record:
        make_trainer(tmp_path, enable_checkpointing=False).fit(LogsInConfigureOptimizers(), *loaders())
    assert not any("not run by a Trainer" in str(w.message) for w in record)


def test_an_ordinary_last_resume_does_not_warn_about_the_checkpoint_folder(tmp_path: Path) -> None:
    make_trainer(tmp_path, logger=True, max_epochs=1).fit(TinyRegressor(), *loaders())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer = make_trainer(tmp_path, logger=True, max_epochs=2)
        trainer.fit(TinyRegressor(), *loaders(), ckpt_path="last")
    assert trainer.ckpt_path.endswith(os.path.join("version_0", "checkpoints", "epoch=0-step=4.ckpt"))
    assert "version_1" in trainer.log_dir
    assert not [str(w.message) for w in record if "folder changed" in str(w.message)]


def test_estimate_memory_of_a_class_with_required_arguments(tmp_path: Path, capsys) -> None:
    from trainer.cli import main

    source = tmp_path / "gpt.py"
    source.write_text(textwrap.dedent("""
        from torch import nn

        class GPT(nn.Module):
            def __init__(self, n_layer, width=64):
                super().__init__()
                self.blocks = nn.Sequential(*[nn.Linear(width, width) for _ in range(n_layer)])

        def make_model():
            return GPT(n_layer=3)
    """))
    assert main(["estimate-memory", f"{source}:GPT"]) == 2
    err = capsys.readouterr().err
    assert "GPT needs the argument(s) n_layer. Pass them as --init-args '{\"n_layer\": ...}' (JSON)" in err, err
    assert f"{source}:make_model" in err and "Traceback" not in err
    assert main(["estimate-memory", f"{source}:GPT", "--init-args", '{"n_layer": 2}']) == 0
    assert main(["estimate-memory", f"{source}:make_model"]) == 0
    assert main(["estimate-memory", f"{source}:GPT", "--init-args", "n_layer=2"]) == 2
    assert "is not JSON" in capsys.readouterr().err
