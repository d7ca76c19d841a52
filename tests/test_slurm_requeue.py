"""SLURM auto-requeue without a cluster: the requeue command and its override, the signal action in one
process (saved, requeued, exit status), and the resume choice of a requeued job."""
from __future__ import annotations

import os
import signal
import sys

import pytest
from helpers import Regressor, loader, quiet_trainer

from trainer.callbacks import Callback
from trainer.strategies.launch.environments import SLURMEnvironment
from trainer.strategies.errors import ConfigurationError
from trainer.faults import slurm_requeue


@pytest.fixture
def slurm_task(monkeypatch):
    """The variables srun gives a one-task job."""
    for key, value in dict(SLURM_JOB_ID="4242", SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0",
                           SLURM_NODEID="0", SLURM_NNODES="1", SLURM_JOB_NAME="train").items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TRAINER_REQUEUE_COMMAND", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def test_requeue_command_default_and_overrides(slurm_task, monkeypatch, tmp_path):
    assert SLURMEnvironment().requeue_command() == ["scontrol", "requeue", "4242"]
    target = tmp_path / "requeued"
    monkeypatch.setenv("TRAINER_REQUEUE_COMMAND", f"{sys.executable} -c \"open('{target}', 'w').write('{{job_id}}')\"")
    SLURMEnvironment().requeue()
    assert target.read_text() == "4242"
    env = SLURMEnvironment(requeue_command="ssh login scontrol requeue {job_id}")
    assert env.requeue_command() == ["ssh", "login", "scontrol", "requeue", "4242"]


def test_requeue_failures_say_what_to_do(slurm_task, monkeypatch):
    monkeypatch.setenv("TRAINER_REQUEUE_COMMAND", "no-such-scontrol requeue {job_id}")
    with pytest.raises(RuntimeError, match="set TRAINER_REQUEUE_COMMAND to a command that requeues job"):
        SLURMEnvironment().requeue()
    monkeypatch.setenv("TRAINER_REQUEUE_COMMAND", f"{sys.executable} -c \"import sys; sys.exit('no such job')\"")
    with pytest.raises(RuntimeError, match="failed with status 1: no such job"):
        SLURMEnvironment().requeue()
    with pytest.raises(ConfigurationError, match="requeue_signal='SIGNOPE' is not a signal"):
        SLURMEnvironment(requeue_signal="SIGNOPE")


def test_a_slurm_task_handles_the_requeue_signal(slurm_task):
    trainer = quiet_trainer()
    assert signal.SIGUSR1 in trainer._faults.signals.actions
    assert slurm_requeue.slurm_environment(trainer).requeue_signal == signal.SIGUSR1


class SignalAtStep(Callback):
    """Sends this process ``signum`` after optimizer step ``step`` (as scancel --signal would)."""

    def __init__(self, step: int, signum: int = signal.SIGUSR1) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def test_sigusr1_saves_runs_the_requeue_command_and_exits(slurm_task, monkeypatch, tmp_path, capsys):
    marker = tmp_path / "requeued"
    monkeypatch.setenv("TRAINER_REQUEUE_COMMAND", f"{sys.executable} -c \"open('{marker}', 'w').write('{{job_id}}')\"")
    trainer = quiet_trainer(max_steps=20, default_root_dir=tmp_path, callbacks=[SignalAtStep(3)])
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit(Regressor(), loader())
    assert exit_info.value.code == 0 and marker.read_text() == "4242" and trainer.global_step == 3
    assert (tmp_path / "checkpoints" / "interrupted.ckpt").exists()
    assert "SIGUSR1: saved" in capsys.readouterr().out


def test_a_failed_requeue_keeps_the_checkpoint_and_fails_the_job(slurm_task, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRAINER_REQUEUE_COMMAND", f"{sys.executable} -c \"import sys; sys.exit('Requeue disabled')\"")
    trainer = quiet_trainer(max_steps=20, default_root_dir=tmp_path, callbacks=[SignalAtStep(2)])
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit(Regressor(), loader())
    assert exit_info.value.code == 1 and (tmp_path / "checkpoints" / "interrupted.ckpt").exists()
    assert "could not be requeued" in capsys.readouterr().err


def test_requeued_job_resumes_from_the_newest_checkpoint(slurm_task, monkeypatch, tmp_path, capsys):
    first = quiet_trainer(max_steps=3, enable_checkpointing=True, default_root_dir=tmp_path)
    first.fit(Regressor(), loader())
    saved = first.checkpoint_callback.last_model_path or first.checkpoint_callback.best_model_path
    assert first.ckpt_path is None and "resuming" not in capsys.readouterr().out  # first run: never resume on its own
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = quiet_trainer(max_steps=5, enable_checkpointing=True, default_root_dir=tmp_path)
    again.fit(Regressor(), loader())
    assert "requeued SLURM job (restart 1): resuming from" in capsys.readouterr().out
    assert again.ckpt_path is not None and again.global_step == 5 and saved
    empty = quiet_trainer(max_steps=2, default_root_dir=tmp_path / "elsewhere")
    empty.fit(Regressor(), loader())
    assert empty.ckpt_path is None and "training starts over" in capsys.readouterr().out
