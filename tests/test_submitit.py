"""submitit without a cluster: in a submitit SLURM job the Trainer takes its timeout signal over (save at a step
boundary, requeue, exit) instead of submitit's handler, which would requeue at once, mid-step, without a save.
The real round trip (timeout, requeue, exact resume) is tests/slurm/test_submitit_requeue.py."""
from __future__ import annotations

import signal
import sys

import pytest
from helpers import Regressor, loader, quiet_trainer

from trainer.callbacks import Callback


@pytest.fixture
def submitit_task(monkeypatch):
    """The variables of one task of a submitit SLURM job."""
    for key, value in dict(SLURM_JOB_ID="4243", SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0",
                           SLURM_NODEID="0", SLURM_NNODES="1", SLURM_JOB_NAME="submitit",
                           SUBMITIT_EXECUTOR="slurm").items():  # fmt: skip
        monkeypatch.setenv(key, value)
    for name in ("SLURM_RESTART_COUNT", "SUBMITIT_PREEMPT_SIGNAL", "TRAINER_REQUEUE_COMMAND"):
        monkeypatch.delenv(name, raising=False)


class SignalAtStep(Callback):
    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            signal.raise_signal(self.signum)


def test_submitits_timeout_signal_saves_requeues_and_exits_without_submitits_handler(submitit_task, monkeypatch,
                                                                                    tmp_path):  # fmt: skip
    marker = tmp_path / "requeued"
    monkeypatch.setenv("TRAINER_REQUEUE_COMMAND", f"{sys.executable} -c \"open('{marker}', 'w').write('{{job_id}}')\"")
    submitit_calls = []
    previous = signal.signal(signal.SIGUSR2, lambda *_: submitit_calls.append("requeued mid-step and exited"))
    try:
        trainer = quiet_trainer(max_steps=20, default_root_dir=tmp_path, callbacks=[SignalAtStep(3, signal.SIGUSR2)])
        with pytest.raises(SystemExit) as exit_info:
            trainer.fit(Regressor(), loader())
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert exit_info.value.code == 0 and trainer.global_step == 3 and marker.read_text() == "4243"
    assert (tmp_path / "checkpoints" / "interrupted.ckpt").exists()
    assert submitit_calls == []


def test_the_signal_named_by_submitit_preempt_signal_is_the_one_taken_over(submitit_task, monkeypatch):
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    signals = quiet_trainer()._faults.signals
    assert signal.SIGUSR1 in signals.actions and signal.SIGUSR1 in signals._taken_over
    monkeypatch.delenv("SUBMITIT_EXECUTOR")
    assert signal.SIGUSR2 not in quiet_trainer()._faults.signals.actions  # a plain SLURM task: only SIGUSR1
