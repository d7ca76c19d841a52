"""Faults during fit: stop signals (chained, acted on at a step boundary), Ctrl-C, non-finite losses,
anomaly detection."""
from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from trainer.callbacks import Callback, ModelCheckpoint
from ckpt_support import TinyRegressor, loaders, make_trainer, same_weights
from trainer.strategies.errors import ConfigurationError
from trainer.faults.nonfinite import NonFiniteLossError


class SignalAt(TinyRegressor):
    """Sends itself ``signum`` (``times`` times) inside training_step of micro-batch ``at`` (0-based, whole fit)."""

    def __init__(self, signum: int = 0, at: int = -1, times: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.signum, self.at, self.times = signum, at, times

    def training_step(self, batch, batch_idx):
        if self.trainer.fit_loop.progress.total_batches == self.at:
            for _ in range(self.times):
                signal.raise_signal(self.signum)
        return super().training_step(batch, batch_idx)


class Exceptions(Callback):
    def __init__(self) -> None:
        self.seen: list[BaseException] = []

    def on_exception(self, trainer, module, exception):
        self.seen.append(exception)


def test_configured_signal_saves_after_the_step_exits_cleanly_and_chains_the_user_handler(tmp_path: Path) -> None:
    calls = []
    user_handler = lambda signum, frame: calls.append(signum)  # noqa: E731
    previous = signal.signal(signal.SIGUSR1, user_handler)
    try:
        train, val = loaders()
        trainer = make_trainer(tmp_path, accumulate_grad_batches=2, stop_signals=("SIGTERM", "SIGUSR1"))
        with pytest.raises(SystemExit) as info:
            trainer.fit(SignalAt(signal.SIGUSR1, at=2), train, val)  # inside the second accumulation window
        assert info.value.code == 0
        assert calls == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is user_handler  # put back after the fit
        saved = torch.load(tmp_path / "checkpoints" / "interrupted.ckpt", weights_only=True)
        assert saved["global_step"] == 2 and saved["loops"]["fit"]["total_batches"] == 4  # the window was finished
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_ctrl_c_runs_on_exception_and_leaves_a_checkpoint_that_resumes_exactly(tmp_path: Path) -> None:
    train, val = loaders()
    torch.manual_seed(0)
    reference = TinyRegressor()
    make_trainer(tmp_path / "ref", max_epochs=2).fit(reference, train, val)

    torch.manual_seed(0)
    module = SignalAt(signal.SIGINT, at=5)
    seen = Exceptions()
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path / "run", callbacks=[seen]).fit(module, train, val)
    assert len(seen.seen) == 1 and isinstance(seen.seen[0], KeyboardInterrupt)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed = TinyRegressor()
    trainer = make_trainer(tmp_path / "run")
    trainer.fit(resumed, train, val, ckpt_path="last")
    assert Path(trainer.ckpt_path).name == "interrupted.ckpt"
    assert same_weights(reference, resumed)


def test_a_ctrl_c_after_the_last_step_still_interrupts(tmp_path: Path) -> None:
    class CtrlCAtTrainEnd(TinyRegressor):
        def on_train_end(self) -> None:
            signal.raise_signal(signal.SIGINT)

    train, val = loaders()
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path).fit(CtrlCAtTrainEnd(), train, val)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_interrupts_at_once(tmp_path: Path) -> None:
    train, val = loaders()
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path).fit(SignalAt(signal.SIGINT, at=1, times=2), train, val)
    assert not (tmp_path / "checkpoints" / "interrupted.ckpt").exists()


class LossTurnsNaN(TinyRegressor):
    def __init__(self, bad_batches=(5,), **kwargs) -> None:
        super().__init__(**kwargs)
        self.bad_batches = set(bad_batches)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.trainer.fit_loop.progress.total_batches in self.bad_batches:
            loss = loss * math.nan
        return loss


def test_nonfinite_loss_stops_naming_the_step_and_the_last_good_checkpoint(tmp_path: Path, capsys) -> None:
    train, val = loaders()
    callback = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = make_trainer(tmp_path, max_epochs=3, callbacks=[callback])
    with pytest.raises(NonFiniteLossError) as raised:  # on_nonfinite_loss="stop" is the default
        trainer.fit(LossTurnsNaN(), train, val)
    err = str(raised.value)
    last_good = tmp_path / "epoch=0-step=4.ckpt"
    assert "loss was nan at global step 5 (epoch 1, batch 1)" in err and f"'{last_good}'" in err
    assert raised.value.checkpoint_path == str(last_good) and raised.value.global_step == 5
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]  # none after the NaN
    assert trainer.global_step == 5 and trainer.interrupted  # on the CPU: stopped before the bad loss's backward


def test_nonfinite_loss_raise_and_skip(tmp_path: Path) -> None:
    train, val = loaders()
    with pytest.raises(NonFiniteLossError, match=r"nan at global step 2 \(epoch 0, batch 2\)"):
        make_trainer(tmp_path, on_nonfinite_loss="raise", enable_checkpointing=False).fit(
            LossTurnsNaN(bad_batches=(2,)), train, val)
    module = LossTurnsNaN(bad_batches=(2, 5))
    trainer = make_trainer(tmp_path, on_nonfinite_loss="skip", enable_checkpointing=False)
    with pytest.warns(UserWarning, match=r"Skipping a micro-batch whose loss is nan at global step 2"):
        trainer.fit(module, train, val)
    assert trainer.global_step == 6  # two of eight micro-batches skipped (each was a whole step here)
    assert all(torch.isfinite(p).all() for p in module.parameters())
    ignored = LossTurnsNaN(bad_batches=(2,))
    make_trainer(tmp_path, on_nonfinite_loss="ignore", enable_checkpointing=False).fit(ignored, train, val)
    assert not torch.isfinite(ignored.net[0].weight).all()


def test_a_stop_signal_ends_a_fit_whose_every_batch_is_skipped(tmp_path: Path) -> None:
    """No optimizer step ever completes (every loss is nan, on_nonfinite_loss='skip'): SIGTERM still saves and exits
    at the end of the accumulation window instead of waiting for a step that never comes."""

    class AlwaysNaN(SignalAt):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) * float("nan")

    train, val = loaders()
    trainer = make_trainer(tmp_path, max_steps=2, max_epochs=-1, accumulate_grad_batches=2, on_nonfinite_loss="skip")
    with pytest.warns(UserWarning, match="Skipping a micro-batch"), pytest.raises(SystemExit) as info:
        trainer.fit(AlwaysNaN(signal.SIGTERM, at=6), train, val)
    assert info.value.code == 0 and trainer.global_step == 0
    saved = torch.load(tmp_path / "checkpoints" / "interrupted.ckpt", weights_only=True)
    assert saved["loops"]["fit"]["total_batches"] == 8  # the signal's window (micro-batches 6 and 7) was finished


FRAMEWORK = tuple(str(Path(__file__).parents[1] / package) for package in ("trainer", "strategies", "callbacks"))


class CountHostReads(Callback):
    """Counts the framework's tensor-to-host reads (each one a device sync on a GPU) between two micro-batches.

    Reads inside torch (e.g. Adam reading its CPU step counter) are not counted.
    """

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop, self.reads = start, stop, []
        self.originals = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        done = trainer.fit_loop.progress.total_batches
        if done == self.start:
            for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
                original = self.originals[name] = getattr(torch.Tensor, name)
                setattr(torch.Tensor, name, self._counted(original))
        if done == self.stop:
            self.restore()

    def _counted(self, original):
        def counted(tensor, *args):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(FRAMEWORK):
                self.reads.append(f"{caller}:{sys._getframe(1).f_lineno}")
            return original(tensor, *args)

        return counted

    def restore(self) -> None:
        for name, original in self.originals.items():
            setattr(torch.Tensor, name, original)
        self.originals = {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible: a host read is a device sync only there")
def test_the_nonfinite_guard_adds_no_host_read_per_step_on_a_gpu(tmp_path: Path) -> None:
    train, _ = loaders(samples=48)
    counter = CountHostReads(start=2, stop=10)
    try:
        trainer = make_trainer(tmp_path, max_epochs=1, on_nonfinite_loss="stop", enable_checkpointing=False,
                               log_every_n_steps=1000, callbacks=[counter], accelerator="cuda", devices=1)  # fmt: skip
        trainer.fit(LossTurnsNaN(bad_batches=()), train)
    finally:
        counter.restore()
    assert counter.reads == []


def test_the_deferred_guard_reads_nothing_until_flushed_and_names_the_exact_step() -> None:
    """The accelerator mode of the guard, driven directly (its logic does not depend on the device): 300 losses
    (more than one stacked chunk) are recorded without a host read; the flush finds the one NaN and its position."""
    from trainer.faults.nonfinite import NonFiniteGuard
    from trainer.loops.progress import Progress

    progress = Progress()
    guard = NonFiniteGuard("stop", progress)
    guard.read_as_it_comes(on_host=False)
    originals = {name: getattr(torch.Tensor, name) for name in ("item", "tolist", "__bool__", "__float__")}
    reads = []
    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, lambda tensor, *a, _o=original, _n=name: reads.append(_n) or _o(tensor, *a))
        for batch in range(300):
            progress.global_step, progress.batch_in_epoch = batch // 2, batch
            guard.check(torch.tensor(math.nan if batch == 271 else 1.0, requires_grad=True) * 2)
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    assert reads == []
    bad = guard.flush()
    assert bad is not None and math.isnan(bad.value) and (bad.global_step, bad.batch_idx) == (135, 271)


def test_on_the_cpu_a_nonfinite_loss_stops_the_fit_before_its_step(tmp_path: Path) -> None:
    train, val = loaders()
    trainer = make_trainer(tmp_path, max_epochs=3, enable_checkpointing=False, on_nonfinite_loss="warn")
    with pytest.warns(UserWarning, match=r"loss was nan at global step 2 \(epoch 0, batch 2\)"):
        trainer.fit(LossTurnsNaN(bad_batches=(2,)), train, val)  # 'warn': fit() returns
    assert trainer.global_step == 2  # the bad step did not run; nothing after it


def test_detect_anomaly_names_the_backward_that_made_nan(tmp_path: Path) -> None:
    class SqrtOfZero(TinyRegressor):
        def training_step(self, batch, batch_idx):
            return torch.sqrt((self(batch[0]) * 0).sum())  # d sqrt(z)/dz at 0 is inf; times 0 gives nan

    train, val = loaders()
    with pytest.raises(RuntimeError, match="returned nan values"):
        make_trainer(tmp_path, detect_anomaly=True, enable_checkpointing=False).fit(SqrtOfZero(), train, val)


@pytest.mark.parametrize("kwargs, message", [
    (dict(on_nonfinite_loss="warning"), "on_nonfinite_loss='warning' is not valid"),
    (dict(stop_signals=("SIGNOPE",)), "'SIGNOPE' is not a signal"),
    (dict(stop_signals=("SIGKILL",)), "cannot be caught"),
])  # fmt: skip
def test_invalid_fault_settings(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make_trainer(tmp_path, **kwargs)
