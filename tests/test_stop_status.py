"""A stop that is not a normal end is visible to the script: ``trainer.interrupted`` after SIGTERM (which then
exits the process, status 0, after saving ``interrupted.ckpt``) and after Ctrl-C (``KeyboardInterrupt``)."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ckpt_support import TinyRegressor, loaders, make_trainer


class SignalsItself(TinyRegressor):
    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum

    def training_step(self, batch, batch_idx):
        if self.trainer.fit_loop.progress.total_batches == 2:
            signal.raise_signal(self.signum)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)])
def test_a_stop_signal_leaves_the_trainer_interrupted(tmp_path: Path, signum: int, raised: type) -> None:
    trainer = make_trainer(tmp_path, max_epochs=2)
    with pytest.raises(raised) as info:
        trainer.fit(SignalsItself(signum), *loaders())
    assert trainer.interrupted and trainer.global_step == 3
    if raised is SystemExit:
        assert info.value.code == 0  # a pre-empted job is not a failed one
    assert list(tmp_path.rglob("interrupted.ckpt"))
    trainer.validate(TinyRegressor(), loaders()[1], verbose=False)
    assert not trainer.interrupted  # each stage says how it ended
