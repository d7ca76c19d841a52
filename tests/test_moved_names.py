"""Pieces moved below the files that needed each other stay importable where users and plugins found them."""
from __future__ import annotations

import os

import pytest

from trainer.strategies import CheckpointError
from trainer.strategies.checkpoint import atomic_write, checkpoint_io, checkpoint_manifest, storage
from trainer.strategies.errors import CheckpointError as ErrorsCheckpointError


def test_checkpoint_io_still_offers_the_atomic_writes_and_checkpoint_error(tmp_path):
    assert checkpoint_io.CheckpointError is ErrorsCheckpointError is CheckpointError
    for name in ("atomic_save", "atomic_link", "atomic_copy", "atomic_write_bytes", "remove_checkpoint",
                 "replace_folder", "temporary_name"):  # fmt: skip
        assert getattr(checkpoint_io, name) is getattr(atomic_write, name), name
    target = tmp_path / "a.ckpt"
    checkpoint_io.atomic_save({"x": 1}, target)
    assert checkpoint_io.safe_load(target) == {"x": 1}
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.ckpt"):
        checkpoint_io.safe_load(tmp_path / "bad.ckpt")


def test_the_manifest_name_is_one_constant(tmp_path):
    assert checkpoint_manifest.MANIFEST_FILE == storage.MANIFEST_FILE == "manifest.json"
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "shard.bin").write_bytes(b"1234")
    checkpoint_manifest.write_folder_manifest(str(tmp_path / "folder"))
    assert os.path.exists(tmp_path / "folder" / storage.MANIFEST_FILE)
    checkpoint_manifest.verify_folder(str(tmp_path / "folder"))


def test_launcher_defaults_names_stay_importable_from_launch_defaults():
    from trainer.config import launch_defaults, launch_env

    assert launch_defaults.ENV_CONFIG == launch_env.ENV_CONFIG == "TRAINER_CONFIG"
    assert launch_defaults.ENV_ARGS == launch_env.ENV_ARGS == "TRAINER_ARGS"
    assert launch_defaults.decorated_parameters is launch_env.decorated_parameters
    assert not launch_env.arguments_resolved()
    with launch_defaults.resolved_arguments():
        assert launch_env.arguments_resolved()
    assert not launch_env.arguments_resolved()
