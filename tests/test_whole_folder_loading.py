"""Reading a sharded checkpoint folder whole is the built-in whole-model strategies' (``WholeFolderLoading``), not
the ``Strategy`` interface's: the interface imports no checkpoint format (docs/architecture.md, "The layers")."""
from __future__ import annotations

import pytest
import torch

from trainer.strategies import CheckpointError, DDPStrategy, DataParallelStrategy, ModelParallelStrategy
from trainer.strategies.checkpoint.sharded_checkpoint import save_sharded
from trainer.strategies.checkpoint.whole_folder import WholeFolderLoading
from trainer.strategies.single_device import SingleDeviceStrategy
from trainer.strategies.strategy import Strategy


def _folder(tmp_path):
    path = tmp_path / "sharded.ckpt"
    weight = torch.arange(6.0).reshape(3, 2)
    save_sharded(Strategy(), {"global_step": 4, "state_dict": {"layer.weight": weight}}, path)
    return path, weight


@pytest.mark.parametrize("make", [SingleDeviceStrategy, DDPStrategy, DataParallelStrategy, ModelParallelStrategy])
def test_whole_model_strategies_read_a_sharded_folder_whole(tmp_path, make):
    # What resuming a one-process (or DDP) run from an FSDP folder relies on; no process group is needed.
    path, weight = _folder(tmp_path)
    loaded = make().load_checkpoint(path)
    assert loaded["global_step"] == 4 and torch.equal(loaded["state_dict"]["layer.weight"], weight)


def test_a_strategy_of_your_own_reads_files_and_refuses_a_folder_saying_how_to_consolidate(tmp_path):
    path, _ = _folder(tmp_path)
    with pytest.raises(CheckpointError, match="consolidate"):
        Strategy().load_checkpoint(path)
    file = tmp_path / "full.ckpt"
    torch.save({"global_step": 1}, file)
    assert Strategy().load_checkpoint(file) == {"global_step": 1}


def test_a_strategy_of_your_own_reads_folders_by_mixing_in_whole_folder_loading(tmp_path):
    class Mine(WholeFolderLoading, Strategy):
        pass

    path, weight = _folder(tmp_path)
    assert torch.equal(Mine().load_checkpoint(path)["state_dict"]["layer.weight"], weight)
