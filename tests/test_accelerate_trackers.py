"""Accelerate's trackers and ``accelerator.state`` after the import change: ``get_tracker`` gives Accelerate's
tracker API (``log``, ``tracker``/``writer``, ``store_init_configuration``, name "tensorboard"), ranks that do not
log get no trackers and a no-op one, ``init_trackers(config=...)`` records the configuration alone (no
``hp_metric``), and ``accelerator.state`` reads and prints as Accelerate's."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from launching import finish, start
from test_ddp_processes import clean_env
from trainer.accelerate import Accelerator

JOB = Path(__file__).resolve().parent / "scripts" / "accelerate_trackers_job.py"


def _event_tags(run: Path) -> dict[str, list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    return events.Tags()


def test_get_tracker_has_accelerates_tracker_api_and_no_hp_metric_is_added(tmp_path):
    pytest.importorskip("tensorboard", reason="the TensorBoard tracker needs the tensorboard package")
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=tmp_path)
    accelerator.init_trackers("run", config={"lr": 0.1})
    tracker = accelerator.get_tracker("tensorboard")
    assert tracker.name == "tensorboard" and [t.name for t in accelerator.trackers] == ["tensorboard"]
    assert tracker.tracker is tracker.writer is accelerator.get_tracker("tensorboard", unwrap=True)
    assert type(tracker.writer).__name__ == "SummaryWriter"
    tracker.log({"x": 1.0, "group": {"a": 2.0}, "note": "text"}, step=0)
    tracker.store_init_configuration({"batch_size": 8})
    accelerator.end_training()
    tags = _event_tags(tmp_path / "run")  # Accelerate's folder: project_dir/project_name, no version_N
    assert "x" in tags["scalars"] and "hp_metric" not in tags["scalars"]
    assert _event_tags(tmp_path / "run" / "group_a")["scalars"] == ["group"]  # a dict: one chart, as Accelerate
    [hparams] = tmp_path.rglob("hparams.yaml")
    assert "lr: 0.1" in hparams.read_text() and "batch_size: 8" in hparams.read_text()


def test_accelerator_state_reads_and_prints_as_accelerates():
    state = Accelerator(cpu=True).state
    assert (state.num_processes, state.process_index, state.distributed_type.value, state.mixed_precision) == (
        1, 0, "NO", "no")  # fmt: skip
    assert repr(state).splitlines() == ["Distributed environment: NO", "Num processes: 1", "Process index: 0",
                                        "Local process index: 0", "Device: cpu", "", "Mixed precision type: no"]  # fmt: skip


@pytest.mark.timeout(200)
def test_on_two_processes_only_rank_zero_has_trackers_and_the_others_get_no_ops(tmp_path):
    pytest.importorskip("tensorboard", reason="the TensorBoard tracker needs the tensorboard package")
    finish(start([sys.executable, str(JOB), str(tmp_path)], clean_env(), tmp_path), 150)
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in (0, 1))
    assert rank0["trackers"] == ["tensorboard"] and rank1["trackers"] == []
    assert rank0["name"] == "tensorboard" and rank1["name"] == ""  # rank 1's get_tracker: the no-op tracker
    assert rank0["state"] == (2, 0, "MULTI_CPU", "no", "cpu") and rank1["state"] == (2, 1, "MULTI_CPU", "no", "cpu")
    assert rank0["repr"].startswith("Distributed environment: MULTI_CPU  Backend: gloo\nNum processes: 2\n")
    scalars = set(_event_tags(tmp_path / "run")["scalars"])
    assert scalars == {"loss", "raw", "acc"}  # rank 0's values alone, no hp_metric
