"""``fabric.save``/``fabric.load`` under FSDP in one process (the two-process run is in test_fabric.py): the path
becomes a sharded folder, as Lightning's Fabric writes, it loads back into freshly set-up objects, and the misuses
it brings are refused with what to do."""
from __future__ import annotations

import pytest
import torch

from trainer.fabric import Fabric
from trainer.strategies.errors import ConfigurationError


@pytest.fixture
def fabric():
    fabric = Fabric(accelerator="cpu", devices=1, strategy="fsdp")
    fabric.launch()
    yield fabric
    fabric.strategy.teardown()


def _setup(fabric: Fabric, seed: int):
    torch.manual_seed(seed)
    model = fabric.setup_module(torch.nn.Linear(3, 2))
    return model, fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def _full(state: dict) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in state.items()}


@pytest.mark.timeout(120)
def test_fsdp_save_writes_a_sharded_folder_that_loads_back(fabric, tmp_path):
    model, optimizer = _setup(fabric, seed=0)
    fabric.backward(model(torch.ones(4, 3)).sum())
    optimizer.step()
    fabric.save(tmp_path / "state", {"model": model, "optimizer": optimizer, "step": 7})
    assert (tmp_path / "state").is_dir() and list((tmp_path / "state").glob("*.distcp"))

    fresh_model, fresh_optimizer = _setup(fabric, seed=1)
    state = {"model": fresh_model, "optimizer": fresh_optimizer, "step": 0}
    assert fabric.load(tmp_path / "state", state) == {}
    assert state["step"] == 7
    assert all(torch.equal(a, b) for a, b in zip(_full(model.state_dict()).values(),
                                                 _full(fresh_model.state_dict()).values()))  # fmt: skip
    momenta = [[o.state[p]["momentum_buffer"].full_tensor() for p in o.param_groups[0]["params"]]
               for o in (optimizer, fresh_optimizer)]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(*momenta)) and momenta[0]
    assert sorted(fabric.load(tmp_path / "state")) == ["model", "optimizer", "step"]  # no state: everything, whole

    with pytest.raises(ConfigurationError, match="'state_dict' is taken .* rename that entry"):
        fabric.save(tmp_path / "other", {"model": model, "state_dict": 1})
    with pytest.raises(ConfigurationError, match="is a sharded folder .* fabric.load\\(path, state\\)"):
        fabric.load_raw(tmp_path / "state", fresh_model)
