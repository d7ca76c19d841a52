"""The launchers on their own: the spawn launcher with real processes, and the subprocess launcher's refusal
to re-run commands that are not a training script."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from trainer.strategies.launch.environments import LocalEnvironment
from trainer.strategies.errors import ConfigurationError, RankFailedError
from trainer.strategies.launch.launchers import SpawnLauncher

ROOT = Path(__file__).resolve().parents[1]


def fail_on_rank_one() -> str:
    """Runs in each spawned process: rank 1 raises, rank 0 finishes."""
    if os.environ["RANK"] == "1":
        raise ValueError("rank one refuses")
    return "rank 0 done"


def two_process_launcher() -> SpawnLauncher:
    env = LocalEnvironment()
    env.validate(num_devices=2, num_nodes=1)
    return SpawnLauncher(env, num_processes=2)


@pytest.mark.timeout(120)
def test_spawn_launcher_raises_the_failing_ranks_traceback_in_the_caller():
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"(?s)rank 1 failed.*ValueError: rank one refuses"):
        two_process_launcher().launch(fail_on_rank_one)
    assert time.monotonic() - started < 60


def test_ddp_refuses_to_relaunch_pytest():
    from tests.scripts.ddp_train import Indexed, Net
    from trainer import Trainer

    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, max_epochs=1,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    if trainer.strategy.launcher is None:
        pytest.skip("the test session itself runs inside a multi-process job")
    with pytest.raises(ConfigurationError, match="pytest"):
        trainer.fit(Net(), DataLoader(Indexed(8, seed=0), batch_size=4))


@pytest.mark.timeout(120)
def test_ddp_from_python_c_explains_that_it_needs_a_script():
    code = (
        "from torch.utils.data import DataLoader\n"
        "from tests.scripts.ddp_train import Indexed, Net\n"
        "from trainer import Trainer\n"
        "Trainer(accelerator='cpu', devices=2, logger=False).fit(Net(), DataLoader(Indexed(8, seed=0), batch_size=4))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK")}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=100)
    assert result.returncode != 0
    assert "ConfigurationError" in result.stderr and "python train.py" in result.stderr
