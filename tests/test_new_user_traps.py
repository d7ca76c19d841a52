"""A new user's last traps: resuming after changing the optimizer, a typo in a YAML class_path or init_args (one
`trainer run: error:` line, exit 2, before any worker starts), printed names that an installed wheel has,
``ckpt_path=True`` and a ``ModelCheckpoint(dirpath=...)`` that is a file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer import ConfigurationError, Trainer
from trainer.callbacks import ModelCheckpoint
from trainer.demos import BoringModel
from trainer.strategies.errors import CheckpointError

QUIET = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
             limit_val_batches=0)  # fmt: skip


def test_resuming_after_changing_the_optimizer_says_so_and_what_to_do(tmp_path):
    class WithSGD(BoringModel):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class WithAdam(BoringModel):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.1)

    trainer = Trainer(max_steps=2, default_root_dir=tmp_path, enable_checkpointing=False, **QUIET)
    trainer.fit(WithSGD())
    trainer.save_checkpoint(tmp_path / "sgd.ckpt")
    resumed = Trainer(max_steps=4, default_root_dir=tmp_path, enable_checkpointing=False, **QUIET)
    with pytest.raises(CheckpointError, match=r"saved by a different optimizer than the Adam .*'betas'.*"
                                              r"load_from_checkpoint"):  # fmt: skip
        resumed.fit(WithAdam(), ckpt_path=tmp_path / "sgd.ckpt")


def _run_cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("TRAINER_CONFIG", None)
    env.pop("TRAINER_ARGS", None)
    return subprocess.run([sys.executable, "-m", "trainer", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("class_path: trainer.callbacks.EarlyStoping\n      init_args: {monitor: val_loss}",
         "trainer.callbacks[0]: class_path 'trainer.callbacks.EarlyStoping' cannot be imported: 'trainer.callbacks' "
         "has no 'EarlyStoping'. Did you mean 'EarlyStopping'?"),
        ("class_path: trainer.callbacks.EarlyStopping\n      init_args: {monitr: val_loss}",
         "trainer.callbacks[0]: init_args of 'trainer.callbacks.EarlyStopping' has unknown key 'monitr'. Did you mean "
         "'monitor'?"),
        ("class_path: trainer.callbacks.EarlyStopping",
         "trainer.callbacks[0]: init_args of 'trainer.callbacks.EarlyStopping' misses the required key(s) monitor."),
    ],
    ids=["class_path", "init_args-key", "missing-init_args"],
)
def test_a_class_path_typo_is_one_error_line_before_any_worker_starts(tmp_path, entry, expected):
    (tmp_path / "cfg.yaml").write_text(f"devices: 2\ntrainer:\n  callbacks:\n    - {entry}\n")
    marker = tmp_path / "started"
    (tmp_path / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = _run_cli(tmp_path, "run", "--config", "cfg.yaml", "train.py")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"trainer run: error: cfg.yaml: {expected}"), line
    assert not marker.exists(), "a worker started although the file was invalid"


def test_ckpt_path_true_is_refused_naming_the_argument(tmp_path):
    trainer = Trainer(max_steps=1, default_root_dir=tmp_path, **QUIET)
    fit, validate = (lambda: trainer.fit(BoringModel(), ckpt_path=True),
                     lambda: trainer.validate(BoringModel(), ckpt_path=1))  # fmt: skip
    for call in (fit, validate):
        with pytest.raises(ConfigurationError, match=r"ckpt_path=(True|1)\) is not a checkpoint"):
            call()


def test_a_model_checkpoint_dirpath_that_is_a_file_is_refused_up_front(tmp_path):
    existing = tmp_path / "model.ckpt"
    existing.write_text("")
    with pytest.raises(ConfigurationError, match=r"ModelCheckpoint\(dirpath='.*model.ckpt'\) is an existing file"):
        ModelCheckpoint(dirpath=existing)


def test_printed_and_documented_names_are_the_installed_ones():
    root = Path(__file__).resolve().parents[1]
    assert "not counted in `global_step`" not in (root / "docs" / "reference.md").read_text()
    report = (root / "callbacks" / "fit_report.py").read_text()
    assert "add trainer.callbacks.ThroughputMonitor()" in report
    with pytest.raises(ConfigurationError, match=r"not a trainer\.Callback"):
        Trainer(callbacks=[object()], **QUIET)


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT to a child process")
@pytest.mark.timeout(120)
def test_a_second_ctrl_c_during_a_checkpoint_save_stops_at_once_and_cleanly(tmp_path):
    import signal
    import time

    script = Path(__file__).resolve().parent / "scripts" / "ctrl_c_save.py"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    try:
        for line in process.stdout:
            if line.strip() == "SAVING":
                break
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)
        pressed = time.monotonic()
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
        stopped_after = time.monotonic() - pressed
    finally:
        process.kill()
    assert process.returncode == 130, output
    assert stopped_after < 3, f"took {stopped_after:.1f}s to stop"
    assert "stopping now. The checkpoints saved before are intact" in output
    assert "enforce fail" not in output and "Traceback" not in output, output
    assert "state_dict" in torch.load(tmp_path / "step1.ckpt", weights_only=True)  # nothing lost
    assert not (tmp_path / "step2.ckpt").exists()
