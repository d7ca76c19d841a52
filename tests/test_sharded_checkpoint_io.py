"""Sharded checkpoint folders in one process: round trip, atomic replacement, folder links and deletion, refusal of
hostile metadata, and the ``checkpoint consolidate`` command's errors. (Writing from several ranks, resuming
and resharding are in test_sharded.py.)"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, atomic_link, remove_checkpoint
from trainer.strategies.checkpoint.sharded_checkpoint import (
    META_FILE,
    is_sharded_checkpoint,
    load_full,
    optimizer_state_by_index,
    optimizer_state_by_name,
    save_sharded,
)
from trainer.strategies.single_device import SingleDeviceStrategy
from trainer.strategies.strategy import Strategy
from trainer.cli import main as trainer_main


def checkpoint(step: int = 3) -> dict:
    weight = torch.arange(6.0).reshape(3, 2) + step
    return {
        "format_version": 1,
        "global_step": step,
        "state_dict": {"layer.weight": weight, "layer.bias": torch.zeros(3)},
        "optimizer_states": [{
            "state": {"layer.weight": {"step": torch.tensor(float(step)), "exp_avg": weight * 0.5}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": ["layer.weight", "layer.bias"]}],
        }],
        "rng": {"torch": torch.get_rng_state()},
    }  # fmt: skip


def test_folder_round_trip_gives_a_normal_full_checkpoint(tmp_path):
    path = tmp_path / "a.ckpt"
    save_sharded(Strategy(), checkpoint(), path)
    assert is_sharded_checkpoint(path)
    assert not list(tmp_path.glob(".a.ckpt.*"))  # no temporary left behind
    loaded = load_full(path)
    assert loaded["global_step"] == 3 and torch.equal(loaded["rng"]["torch"], torch.get_rng_state())
    assert torch.equal(loaded["state_dict"]["layer.weight"], checkpoint()["state_dict"]["layer.weight"])
    state = loaded["optimizer_states"][0]
    assert state["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}]  # torch's index keys
    assert torch.equal(state["state"][0]["exp_avg"], checkpoint()["optimizer_states"][0]["state"]["layer.weight"]["exp_avg"])


def test_saving_again_replaces_the_folder_and_clears_what_a_killed_writer_left(tmp_path):
    path = tmp_path / "last.ckpt"
    save_sharded(Strategy(), checkpoint(1), path)
    stale = tmp_path / ".last.ckpt.tmp-99999"  # a writer killed mid-save
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"partial")
    save_sharded(Strategy(), checkpoint(2), path)
    assert not stale.exists()
    assert load_full(path)["global_step"] == 2


def test_a_folder_without_its_metadata_is_not_loaded_as_a_checkpoint(tmp_path):
    path = tmp_path / "half.ckpt"
    save_sharded(Strategy(), checkpoint(), path)
    (path / META_FILE).unlink()
    assert not is_sharded_checkpoint(path)
    with pytest.raises(CheckpointError, match="interrupted copy"):
        SingleDeviceStrategy().load_checkpoint(path)


def test_last_link_and_deletion_work_on_folders(tmp_path):
    source = tmp_path / "epoch=0-step=3.ckpt"
    save_sharded(Strategy(), checkpoint(), source)
    last = tmp_path / "last.ckpt"
    atomic_link(source, last)
    assert os.stat(last / META_FILE).st_ino == os.stat(source / META_FILE).st_ino  # hard links, no copy
    atomic_link(source, last)  # replacing an existing folder
    remove_checkpoint(source)
    assert not source.exists() and load_full(last)["global_step"] == 3  # the link survives its source
    atomic_link(last, tmp_path / "link.ckpt", symbolic=True)
    assert (tmp_path / "link.ckpt").is_symlink() and is_sharded_checkpoint(tmp_path / "link.ckpt")
    remove_checkpoint(tmp_path / "link.ckpt")
    assert last.exists()  # deleting a link leaves its target


class _Hostile:
    def __reduce__(self):
        return (os.makedirs, ("PWNED",))


def test_hostile_metadata_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "evil.ckpt"
    save_sharded(Strategy(), checkpoint(), path)
    (path / ".metadata").write_bytes(pickle.dumps(_Hostile()))
    with pytest.raises(CheckpointError, match=r"'\.metadata' has \d+ bytes, the manifest records"):
        load_full(path)  # the manifest notices first
    (path / "manifest.json").unlink()  # a forger rewrites the manifest too (here: a folder without one)
    with pytest.raises(CheckpointError, match=r"'(os|posix)\.makedirs'"):
        load_full(path)
    assert not Path("PWNED").exists()


@pytest.mark.filterwarnings("ignore:Detected an existing checkpoint", "ignore:torch.distributed is disabled")
def test_pickled_objects_inside_the_dcp_data_are_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    path = tmp_path / "objects.ckpt"
    save_sharded(Strategy(), checkpoint(), path)
    dcp.save({"state_dict/extra": {"any": "object"}}, checkpoint_id=str(path), no_dist=True)
    (path / "manifest.json").unlink()  # written by hand: no manifest describes it
    with pytest.raises(CheckpointError, match="pickled object"):
        load_full(path)


def test_optimizer_state_keys_convert_both_ways():
    by_name = checkpoint()["optimizer_states"][0]
    by_index = optimizer_state_by_index(by_name)
    assert list(by_index["state"]) == [0] and by_index["param_groups"][0]["params"] == [0, 1]
    assert optimizer_state_by_name(by_index, ["layer.weight", "layer.bias"]) == by_name
    # Numbered as the optimizer loading it orders its parameters, not as the saving one did.
    reordered = optimizer_state_by_index(by_name, ["layer.bias", "layer.weight"])
    assert list(reordered["state"]) == [1] and reordered["param_groups"][0]["params"] == [1, 0]
    with pytest.raises(CheckpointError, match=r"lacks: \['layer.bias'\]"):
        optimizer_state_by_index(by_name, ["layer.weight"])
    with pytest.raises(CheckpointError, match="covers 2 parameters but the optimizer has 3"):
        optimizer_state_by_name(by_index, ["a", "b", "c"])


def test_consolidate_command_explains_what_is_wrong(tmp_path, capsys):
    assert trainer_main(["checkpoint", "consolidate", str(tmp_path / "missing"), str(tmp_path / "out.ckpt")]) == 2
    assert "not found" in capsys.readouterr().err
    torch.save({"state_dict": {}}, tmp_path / "file.ckpt")
    assert trainer_main(["checkpoint", "consolidate", str(tmp_path / "file.ckpt"), str(tmp_path / "out.ckpt")]) == 2
    assert "already a single-file checkpoint" in capsys.readouterr().err
    save_sharded(Strategy(), checkpoint(), tmp_path / "dir.ckpt")
    assert trainer_main(["checkpoint", "consolidate", str(tmp_path / "dir.ckpt"), str(tmp_path / "dir.ckpt" / "out.ckpt")]) == 2
    assert "outside the sharded folder" in capsys.readouterr().err
    assert trainer_main(["checkpoint", "consolidate", str(tmp_path / "dir.ckpt"), str(tmp_path / "out.ckpt")]) == 0
    assert torch.load(tmp_path / "out.ckpt", weights_only=True)["global_step"] == 3
