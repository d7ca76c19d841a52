"""Checkpoint files: atomic writes and links, safe loads with clear errors, and what a checkpoint holds."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from ckpt_support import TinyRegressor, loaders, make_trainer
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, atomic_link, atomic_save, safe_load
from trainer.strategies.errors import ConfigurationError


class Payload:
    """Unpickling this runs a shell command that creates a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("writer", ["torch.save", "legacy torch.save", "raw pickle"])
def test_a_pickle_payload_is_refused_and_never_runs(tmp_path: Path, writer: str) -> None:
    marker = tmp_path / "payload-ran"
    path = tmp_path / "evil.ckpt"
    checkpoint = {"state_dict": {}, "epoch": 0, "extra": Payload(marker)}
    if writer == "torch.save":
        torch.save(checkpoint, path)
    elif writer == "legacy torch.save":
        torch.save(checkpoint, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(checkpoint))
    with pytest.raises(CheckpointError, match="Refusing to load") as info:
        safe_load(path)
    assert str(path) in str(info.value)
    with pytest.raises(CheckpointError, match="Refusing to load"):
        TinyRegressor.load_from_checkpoint(path)
    train, val = loaders()
    with pytest.raises(CheckpointError, match="Refusing to load"):
        make_trainer(tmp_path).fit(TinyRegressor(), train, val, ckpt_path=path)
    assert not marker.exists(), "the payload was executed"


def test_corrupt_or_truncated_files_are_named_without_a_pickle_traceback(tmp_path: Path) -> None:
    good = tmp_path / "good.ckpt"
    atomic_save({"state_dict": {"w": torch.ones(1000)}}, good)
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # inside the tensor's bytes: torch.load alone would load it silently
    for name, content, problem in (("truncated.ckpt", data[: len(data) // 2], "is truncated: the record directory"),
                                   ("empty.ckpt", b"", "is empty"),
                                   ("garbage.ckpt", b"not a checkpoint" * 10, "does not start like a checkpoint"),
                                   ("flipped.ckpt", bytes(flipped), "is corrupted: record 'archive/data/0' (4000 bytes) "
                                                                    "fails its CRC-32 check")):  # fmt: skip
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(CheckpointError) as info:
            safe_load(path)
        message = str(info.value)
        assert f"'{path}' {problem}" in message
        assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained unpickler traceback


def test_missing_path_is_printed(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "model.ckpt"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        safe_load(missing)
    train, val = loaders()
    with pytest.raises(FileNotFoundError, match="nope"):
        make_trainer(tmp_path).fit(TinyRegressor(), train, val, ckpt_path=missing)


def test_last_with_no_checkpoint_warns_where_it_looked_and_starts_fresh(tmp_path: Path) -> None:
    """Always passing ckpt_path="last" is the auto-resume idiom: the first run starts fresh, the next resumes."""
    train, val = loaders()
    first = make_trainer(tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match="no checkpoint exists yet; looked in: .*checkpoints.*current weights"):
        first.fit(TinyRegressor(), train, val, ckpt_path="last")
    assert first.global_step > 0 and first.ckpt_path is None
    second = make_trainer(tmp_path, max_epochs=2)
    second.fit(TinyRegressor(), train, val, ckpt_path="last")
    assert second.ckpt_path is not None and second.global_step == 2 * first.global_step


def test_checkpoint_from_a_different_model_lists_the_keys(tmp_path: Path) -> None:
    train, val = loaders()
    trainer = make_trainer(tmp_path, max_epochs=1)
    trainer.fit(TinyRegressor(), train, val)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)

    class Other(TinyRegressor):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.head = torch.nn.Linear(1, 1)
            del self.net[3]

    with pytest.raises(CheckpointError, match=r"missing keys \[head.bias, head.weight\], unexpected keys "
                                              r"\[net.3.bias, net.3.weight\]"):  # fmt: skip
        Other.load_from_checkpoint(path)
    with pytest.raises(CheckpointError, match="missing keys"):
        make_trainer(tmp_path).fit(Other(), train, val, ckpt_path=path)
    with pytest.raises(CheckpointError, match="size mismatch"):
        TinyRegressor.load_from_checkpoint(path, hidden=5)
    with pytest.raises(CheckpointError, match="(?s)does not fit TinyRegressor: .*size mismatch"):
        make_trainer(tmp_path).fit(TinyRegressor(hidden=5), train, val, ckpt_path=path)


def test_full_checkpoint_contents_load_with_weights_only(tmp_path: Path) -> None:
    train, val = loaders()
    trainer = make_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=3)
    trainer.fit(TinyRegressor(hidden=5), train, val)
    path = tmp_path / "full.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "epoch", "global_step", "hyper_parameters",
                "callbacks", "loops", "rng", "format_version", "train_sampler", "precision"):  # fmt: skip
        assert key in checkpoint, key
    assert checkpoint["hyper_parameters"]["hidden"] == 5
    assert checkpoint["global_step"] == 2 and checkpoint["loops"]["fit"]["total_batches"] == 4
    assert {"torch", "python", "numpy"} <= set(checkpoint["rng"])
    assert "ModelCheckpoint" in next(iter(checkpoint["callbacks"]))


def test_weights_only_checkpoint_loads_but_cannot_resume(tmp_path: Path) -> None:
    train, val = loaders()
    trainer = make_trainer(tmp_path, max_epochs=1)
    module = TinyRegressor(hidden=5, lr=0.5)
    trainer.fit(module, train, val)
    path = tmp_path / "weights.ckpt"
    trainer.save_checkpoint(path, weights_only=True)
    checkpoint = torch.load(path, weights_only=True)
    assert "optimizer_states" not in checkpoint and "rng" not in checkpoint
    rebuilt = TinyRegressor.load_from_checkpoint(path, lr=0.1)
    assert rebuilt.hparams.hidden == 5 and rebuilt.hparams.lr == 0.1
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), rebuilt.state_dict().values()))
    with pytest.raises(CheckpointError, match="weights only"):
        make_trainer(tmp_path).fit(TinyRegressor(hidden=5), train, val, ckpt_path=path)


def test_atomic_save_replaces_whole_and_leaves_no_temporaries(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.ckpt"
    atomic_save({"v": 1}, path)
    atomic_save({"v": 2}, path)
    assert safe_load(path) == {"v": 2}
    assert os.listdir(path.parent) == ["a.ckpt"]


@pytest.mark.parametrize("symbolic", [False, True])
def test_atomic_link_points_last_at_the_newest_file(tmp_path: Path, symbolic: bool) -> None:
    first, second, last = tmp_path / "step=1.ckpt", tmp_path / "step=2.ckpt", tmp_path / "last.ckpt"
    atomic_save({"step": 1}, first)
    atomic_save({"step": 2}, second)
    atomic_link(first, last, symbolic=symbolic)
    assert safe_load(last) == {"step": 1}
    atomic_link(second, last, symbolic=symbolic)
    assert safe_load(last) == {"step": 2}
    assert last.is_symlink() == symbolic
    if not symbolic:
        second.unlink()  # a hard link keeps the data when the top-k rotation deletes the original
        assert safe_load(last) == {"step": 2}
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in (first, second, last) if p.exists())


def test_a_subclass_reloads_when_its_base_class_saved_the_hyperparameters(tmp_path: Path) -> None:
    """The base's save_hyperparameters() records the base's arguments; the subclass takes others. Loading keeps
    only the arguments the subclass's __init__ accepts (as Lightning does), so the checkpoint still reloads."""

    class Wider(TinyRegressor):
        def __init__(self, width: int = 7) -> None:
            super().__init__(hidden=width, lr=0.2)

    train, val = loaders()
    trainer = make_trainer(tmp_path, max_epochs=1)
    module = Wider(width=5)
    trainer.fit(module, train, val)
    path = tmp_path / "wider.ckpt"
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=True)["hyper_parameters"] == {"hidden": 5, "lr": 0.2, "val_scores": None}
    rebuilt = Wider.load_from_checkpoint(path, width=5)
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), rebuilt.state_dict().values()))
    with pytest.raises(ConfigurationError, match="unexpected keyword argument 'depth'"):
        Wider.load_from_checkpoint(path, depth=3)  # an override the class does not take is still an error
