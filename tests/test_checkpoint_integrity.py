"""Checkpoints that can be trusted: damaged ones are refused and skipped by "last"/"auto", a full disk keeps the
previous one, asynchronous saves write what was there at the save and never point "last" at a partial file,
keep_last_n retention."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ckpt_support import TinyRegressor, loaders, make_trainer, same_weights, uninterrupted

from trainer.callbacks import ModelCheckpoint
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, safe_load

SCRIPTS = Path(__file__).parent / "scripts"


def _steps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_a_truncated_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path: Path) -> None:
    train, val = loaders()
    reference = uninterrupted(tmp_path / "ref", max_epochs=3)

    torch.manual_seed(0)
    callback = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1, save_last=True)
    make_trainer(tmp_path, max_epochs=2, callbacks=[callback]).fit(TinyRegressor(), train, val)
    newest, previous = tmp_path / "ckpt" / "epoch=1-step=8.ckpt", tmp_path / "ckpt" / "epoch=1-step=6.ckpt"
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) - 100])  # last.ckpt is a hard link to it: damaged too

    for ckpt_path in ("last", "auto"):
        resumed = TinyRegressor()
        trainer = make_trainer(tmp_path, max_epochs=3,
                               callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=0)])  # writes none
        with pytest.warns(UserWarning, match=r"Skipping a damaged checkpoint: Checkpoint '.*(step=8|last).ckpt' is truncated"):
            trainer.fit(resumed, train, val, ckpt_path=ckpt_path)
        assert trainer.ckpt_path == str(previous)
        assert same_weights(reference, resumed)  # two steps redone from step 6: the same end

    with pytest.raises(CheckpointError, match="is truncated"):  # named explicitly: refused, no fallback
        make_trainer(tmp_path, max_epochs=3).fit(TinyRegressor(), train, val, ckpt_path=newest)
    for path in (tmp_path / "ckpt").glob("*.ckpt"):
        path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(CheckpointError, match="Every checkpoint of this run is damaged"):
        make_trainer(tmp_path, max_epochs=3, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt")]).fit(
            TinyRegressor(), train, val, ckpt_path="last")


def test_auto_starts_over_then_resumes(tmp_path: Path, capsys) -> None:
    train, val = loaders()
    first = make_trainer(tmp_path, max_epochs=1)
    first.fit(TinyRegressor(), train, val, ckpt_path="auto")
    assert first.ckpt_path is None and "ckpt_path='auto': no checkpoint found" in capsys.readouterr().out
    second = make_trainer(tmp_path, max_epochs=2)
    second.fit(TinyRegressor(), train, val, ckpt_path="auto")
    assert f"ckpt_path='auto': resuming from '{second.ckpt_path}'" in capsys.readouterr().out
    assert second.global_step == 2 * first.global_step


@contextlib.contextmanager
def _little_space(folder: Path, room: int):
    """Writes into ``folder`` fail once about ``room`` more bytes are written: a tmpfs that small where this process
    may mount one (root), else a file-size limit on this process (``RLIMIT_FSIZE``, SIGXFSZ ignored)."""
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(folder)], capture_output=True).returncode == 0
    previous_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        if not mounted:
            resource.setrlimit(resource.RLIMIT_FSIZE, (room, previous_limit[1]))
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, previous_limit)
        signal.signal(signal.SIGXFSZ, previous_handler)
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path: Path, asynchronous: bool) -> None:
    train, val = loaders()
    module = TinyRegressor(hidden=2000)  # ~250 kB of weights and Adam state
    trainer = make_trainer(tmp_path, max_epochs=1, enable_checkpointing=False)
    trainer.fit(module, train, val)
    folder = tmp_path / "small"
    folder.mkdir()
    size = len(_saved_bytes(trainer, tmp_path / "probe.ckpt"))
    with _little_space(folder, room=size + size // 2):
        trainer.save_checkpoint(folder / "good.ckpt")
        before = (folder / "good.ckpt").read_bytes()
        with torch.no_grad():
            module.net[0].weight.add_(1.0)
        with pytest.raises(OSError, match=r"Could not write checkpoint '.*newer.ckpt': (No space left|File too large)"):
            trainer.save_checkpoint(folder / "newer.ckpt", asynchronous=asynchronous)
            trainer._checkpoint.finish_writes()  # the background write's error surfaces on this thread
        assert _steps(folder) == ["good.ckpt"]  # no half-written file, no temporary left behind
        assert (folder / "good.ckpt").read_bytes() == before
        assert safe_load(folder / "good.ckpt")["global_step"] == trainer.global_step


def _saved_bytes(trainer, path: Path) -> bytes:
    trainer.save_checkpoint(path)
    return path.read_bytes()


def test_an_asynchronous_save_holds_the_state_of_its_step_and_last_follows_complete_files(tmp_path: Path) -> None:
    train, val = loaders()
    reference = uninterrupted(tmp_path / "ref", max_epochs=3)

    torch.manual_seed(0)
    module = TinyRegressor()
    callback = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_last=True, keep_last_n=2,
                               asynchronous=True)  # fmt: skip
    trainer = make_trainer(tmp_path, max_epochs=2, callbacks=[callback])
    trainer.fit(module, train, val)
    assert _steps(tmp_path / "ckpt") == ["epoch=1-step=7.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]
    last = safe_load(tmp_path / "ckpt" / "last.ckpt")
    assert last["global_step"] == 8
    assert all(torch.equal(last["state_dict"][k], v) for k, v in module.state_dict().items())

    weights = {k: v.clone() for k, v in module.state_dict().items()}
    trainer.save_checkpoint(tmp_path / "now.ckpt", asynchronous=True)
    with torch.no_grad():  # the training thread changes the weights while the writer writes
        for parameter in module.parameters():
            parameter.mul_(0.0)
    trainer._checkpoint.finish_writes()
    saved = safe_load(tmp_path / "now.ckpt")["state_dict"]
    assert all(torch.equal(saved[k], v) for k, v in weights.items())

    resumed = TinyRegressor()
    make_trainer(tmp_path, max_epochs=3).fit(resumed, train, val, ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    assert same_weights(reference, resumed)


def test_a_crash_during_a_background_write_leaves_last_at_a_complete_checkpoint(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / "async_crash.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 9, done.stdout + done.stderr  # killed inside the writer thread, mid-file
    folder = tmp_path / "checkpoints"
    assert "epoch=0-step=3.ckpt" not in _steps(folder) and any(p.name.startswith(".") for p in folder.iterdir())
    last = safe_load(folder / "last.ckpt")
    assert last["global_step"] == 2  # the last complete one
    trainer = make_trainer(tmp_path, max_epochs=2, callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)])
    trainer.fit(TinyRegressor(), *loaders(), ckpt_path="last")
    assert trainer.ckpt_path in (str(folder / "last.ckpt"), str(folder / "epoch=0-step=2.ckpt"))
    assert not any(p.name.startswith(".") for p in folder.iterdir())  # the crashed writer's temporary is gone


def test_keep_last_n_keeps_the_newest_beside_the_best(tmp_path: Path) -> None:
    train, val = loaders()
    scores = [3.0, 1.0, 2.0, 4.0]  # epoch 1 is the best
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="val_loss", save_top_k=1, keep_last_n=2)
    latest = ModelCheckpoint(dirpath=tmp_path / "latest", every_n_train_steps=1, keep_last_n=3)
    make_trainer(tmp_path, max_epochs=4, callbacks=[best, latest]).fit(TinyRegressor(val_scores=scores), train, val)
    assert _steps(tmp_path / "best") == ["epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt", "epoch=3-step=16.ckpt"]
    assert _steps(tmp_path / "latest") == ["epoch=3-step=14.ckpt", "epoch=3-step=15.ckpt", "epoch=3-step=16.ckpt"]
    with pytest.raises(ValueError, match="keep_last_n=0"):
        ModelCheckpoint(keep_last_n=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the pinned-memory staging path")
def test_an_asynchronous_save_of_cuda_tensors_stages_into_pinned_memory(tmp_path: Path) -> None:
    from trainer.strategies.checkpoint.async_checkpoint import BackgroundWriter

    writer = BackgroundWriter()
    weights = torch.randn(1024, 1024, device="cuda")
    expected = weights.cpu()
    writer.save_file({"state_dict": {"w": weights}}, tmp_path / "gpu.ckpt")
    weights.mul_(0.0)  # queued on the same stream after the non-blocking copy: it cannot change the copy
    writer.wait()
    assert torch.equal(safe_load(tmp_path / "gpu.ckpt")["state_dict"]["w"], expected)
    assert writer.stager._buffers[("state_dict", "w")].is_pinned()
