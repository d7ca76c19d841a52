"""Restarting a script with ckpt_path="last" finds the previous run's checkpoint even though the default
logger opened a new version_N folder for the new run."""
from __future__ import annotations

from pathlib import Path

from helpers import Regressor, loader
from trainer import Trainer


def _trainer(root: Path, max_epochs: int) -> Trainer:
    return Trainer(default_root_dir=root, max_epochs=max_epochs, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu", devices=1)  # fmt: skip


def test_restarted_script_resumes_from_the_previous_version_folder(tmp_path):
    first = _trainer(tmp_path, max_epochs=2)
    first.fit(Regressor(), loader(n=32), loader(n=16))
    assert Path(first.log_dir).name == "version_0"

    second = _trainer(tmp_path, max_epochs=3)
    second.fit(Regressor(), loader(n=32), loader(n=16), ckpt_path="last")
    assert Path(second.log_dir).name == "version_1"
    assert Path(second.ckpt_path).parent == Path(first.log_dir, "checkpoints").resolve()
    assert second.current_epoch == 3 and second.global_step == first.global_step + 4
