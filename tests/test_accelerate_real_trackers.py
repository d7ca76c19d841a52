"""A script's TensorBoard logging reads back the same after the import change: the same script run on the REAL
Hugging Face Accelerate and on ``trainer.accelerate`` uses ``get_tracker("tensorboard")``'s ``name``, ``log``,
``tracker``, ``writer`` and ``store_init_configuration`` and ``accelerator.log``; the event files hold the same
scalars, in the same run folders (``project_dir/<run>``, dicts as ``<run>/<key>_<sub>``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

accelerate = pytest.importorskip("accelerate", reason="compares against the real Hugging Face Accelerate (extra 'peers')")
pytest.importorskip("tensorboard", reason="reads the TensorBoard event files back")

import trainer.accelerate as ours  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Real Accelerate keeps one process-wide state; reset it so each Accelerator starts as in a new script."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _script(accelerator_class, project_dir: Path) -> dict:
    """What a training script does with its tracker; returns what it read from the tracker's members."""
    accelerator = accelerator_class(cpu=True, log_with="tensorboard", project_dir=str(project_dir))
    accelerator.init_trackers("run", config={"lr": 0.1})
    tracker = accelerator.get_tracker("tensorboard")
    seen = {"name": tracker.name, "writer": type(tracker.writer).__name__, "same": tracker.writer is tracker.tracker,
            "unwrap": accelerator.get_tracker("tensorboard", unwrap=True) is tracker.tracker}  # fmt: skip
    tracker.log({"loss": 0.5, "t": torch.tensor(0.25), "group": {"a": 1.0, "b": 2.0}, "note": "hi"}, step=1)
    tracker.writer.add_scalar("raw", 3.0, 2)
    accelerator.log({"loss": 0.4, "group": {"a": 1.5}}, step=2)
    tracker.store_init_configuration({"batch_size": 8})
    accelerator.end_training()
    return seen


def _scalars(project_dir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Each run folder's scalars (tag -> (step, value)s) and text tags, read from the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = {}
    for run in sorted({path.parent for path in project_dir.rglob("events.out.tfevents.*")}):
        events = EventAccumulator(str(run))
        events.Reload()
        tags = events.Tags()
        scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags["scalars"]}
        if scalars or tags["tensors"]:
            runs[str(run.relative_to(project_dir))] = {**scalars, "text": sorted(tags["tensors"])}
    return runs


def test_the_same_tracker_script_writes_the_same_scalars_as_on_accelerate(tmp_path):
    from accelerate.state import AcceleratorState

    real_seen = _script(accelerate.Accelerator, tmp_path / "real")
    AcceleratorState._reset_state(reset_partial_state=True)
    our_seen = _script(ours.Accelerator, tmp_path / "ours")
    assert our_seen == real_seen == {"name": "tensorboard", "writer": "SummaryWriter", "same": True, "unwrap": True}
    real, mine = _scalars(tmp_path / "real"), _scalars(tmp_path / "ours")
    assert mine == real
    assert real["run"]["loss"] == [(1, 0.5), (2, pytest.approx(0.4))] and real["run/group_a"]["group"] == [(1, 1.0), (2, 1.5)]
