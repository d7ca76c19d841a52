"""A non-finite loss is not a success: ``fit()`` raises ``NonFiniteLossError`` naming the step and the last good
checkpoint, with the last good weights in memory ("warn" returns instead), and a script that lets it through exits
non-zero (as ``trainer run`` then does)."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer import NonFiniteLossError
from trainer.callbacks import Callback, ModelCheckpoint
from ckpt_support import TinyRegressor, loaders, make_trainer

SCRIPT = Path(__file__).parent / "scripts" / "nan_stop.py"


class LossTurnsNaN(TinyRegressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.trainer.fit_loop.progress.total_batches == 5 else loss


class WeightsAfterEachStep(Callback):
    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.by_step[trainer.global_step] = {k: v.clone() for k, v in module.state_dict().items()}


def test_fit_raises_with_the_weights_of_the_last_good_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module, seen = LossTurnsNaN(), WeightsAfterEachStep()
    trainer = make_trainer(tmp_path, max_epochs=3, callbacks=[seen, ModelCheckpoint(dirpath=tmp_path,
                                                                                    every_n_train_steps=3)])
    train, val = loaders()
    with pytest.raises(NonFiniteLossError, match=r"global step 5 .*'.*step=3\.ckpt'.*those of global step 5, the "
                                                 r"last good one") as raised:
        trainer.fit(module, train, val)
    assert raised.value.global_step == 5 and raised.value.checkpoint_path.endswith("epoch=0-step=3.ckpt")
    assert trainer.interrupted and trainer.global_step == 5
    for name, value in module.state_dict().items():
        assert torch.isfinite(value).all() and torch.equal(value, seen.by_step[5][name])


def test_warn_stops_the_same_way_but_returns(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = LossTurnsNaN()
    trainer = make_trainer(tmp_path, max_epochs=3, enable_checkpointing=False, on_nonfinite_loss="warn")
    with pytest.warns(UserWarning, match=r"loss was nan at global step 5.*may|loss was nan at global step 5.*last good"):
        trainer.fit(module, *loaders())
    assert trainer.interrupted and trainer.global_step == 5
    assert all(torch.isfinite(p).all() for p in module.parameters())


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
@pytest.mark.timeout(240)
def test_two_ranks_stop_together_reload_the_last_checkpoint_and_the_script_exits_non_zero(tmp_path: Path) -> None:
    """With several ranks the loss is acted on at an agreed check point, after the bad step ran: every rank puts
    back the weights of the last checkpoint saved before it."""
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "2"], env=env, capture_output=True, text=True,
                          timeout=200)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "NonFiniteLossError" in output and "reloaded from that checkpoint" in output, output
    assert "rank 0: caught at step 5, weights as saved: True, interrupted: True" in output, output


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
@pytest.mark.timeout(240)
def test_trainer_run_exits_non_zero_after_a_nan_stop(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "trainer", "run", "--devices", "2", str(SCRIPT), str(tmp_path), "2"],
                          env=env, capture_output=True, text=True, timeout=200, cwd=tmp_path)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "NonFiniteLossError: The training loss was nan at global step 5" in output, output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible: the deferred (no host sync) check runs "
                                                           "in one process only on an accelerator")
def test_on_a_gpu_the_weights_of_the_last_checkpoint_are_put_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = LossTurnsNaN()
    callback = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = make_trainer(tmp_path, max_epochs=3, callbacks=[callback], accelerator="cuda", devices=1)
    with pytest.raises(NonFiniteLossError, match="reloaded from that checkpoint") as raised:
        trainer.fit(module, *loaders())
    saved = torch.load(raised.value.checkpoint_path, weights_only=True)["state_dict"]
    for name, value in module.state_dict().items():
        assert torch.equal(value.cpu(), saved[name].cpu())
