"""The Protocols that stand in for an import (what callbacks, a spawned stage and Engine state-saving use of the
Trainer or Engine) describe the real objects: every member they list exists there, so the written-down surface
cannot drift from what the code provides."""
from __future__ import annotations

from typing import Any

import pytest

from helpers import Regressor, loader, quiet_trainer
from trainer.callbacks.host import CallbackHost
from trainer.engine.engine import Engine
from trainer.engine.state import EngineParts
from trainer.spawned import SpawnHost


def _members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name, value in vars(protocol).items()
              if not name.startswith("__") and (callable(value) or isinstance(value, property))}  # fmt: skip
    return names - {"_is_protocol", "_is_runtime_protocol"}


def _missing(obj: Any, protocol: type) -> list[str]:
    return sorted(name for name in _members(protocol) if not hasattr(obj, name))


@pytest.mark.parametrize("protocol", [CallbackHost, SpawnHost])
def test_a_fitted_trainer_has_every_member_the_callbacks_and_a_spawned_stage_use(protocol):
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(Regressor(), loader(), loader())
    assert _members(protocol), protocol
    assert not _missing(trainer, protocol), f"{protocol.__name__} lists members the Trainer lacks"


def test_an_engine_has_every_member_saving_its_state_uses():
    engine = Engine(accelerator="cpu", devices=1)
    assert not _missing(engine, EngineParts), "EngineParts lists members the Engine lacks"
