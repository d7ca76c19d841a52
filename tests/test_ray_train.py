"""Ray Train on a real local Ray cluster: the same fit inside ``TorchTrainer``'s workers as under ``trainer run``,
bitwise (DDP, FSDP; a Ray Dataset shard as training data), a worker group that Ray restarts after a failure
resumes exactly from Ray's checkpoint, and ``trainer run --ray`` plans the job from the launch flags.

One cluster (``ray.init(num_cpus=2)``) serves the module; each ``TorchTrainer.fit`` costs ~30 s here."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from helpers import restored_process_state
from launching import SCRIPTS, run, trainer_command

ray = pytest.importorskip("ray", reason="Ray Train tests need ray (pip install 'trainer[ray]')")
pytest.importorskip("ray.train.torch", reason="Ray Train tests need ray[train]")

STEPS, EVERY = 16, 5  # checkpoints at steps 5, 10, 15; the injected failure at step 12 resumes from step 10


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs whose workers import this tree and the test scripts. ``ray.init`` sets RAY_*
    variables and a SIGTERM handler in this process (and each ``TorchTrainer.fit`` a SIGINT one that aborts its
    run); all are put back afterwards, or a later test's signal would reach a shut-down cluster."""
    paths = [str(Path(__file__).resolve().parents[1]), str(SCRIPTS), str(SCRIPTS.parent)]
    with restored_process_state((signal.SIGINT, signal.SIGTERM)):
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([saved] if saved else []))
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same fits under ``trainer run --devices 2`` (torchrun, 2 gloo processes)."""
    out = tmp_path_factory.mktemp("torchrun")
    run(trainer_command("run", "--devices", "2", str(SCRIPTS / "cluster_fit.py"), str(out), "--strategy", "ddp,fsdp",
                        "--steps", str(STEPS), "--every", str(EVERY)), cwd=out, timeout=240)  # fmt: skip
    return out


def fit_on_ray(out: Path, strategy: str, ray_data: bool = False):
    import sys

    sys.path.insert(0, str(SCRIPTS))
    import cluster_fit
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    config = dict(out=str(out), strategy=strategy, steps=STEPS, every=EVERY, ray_data=ray_data)
    datasets = {}
    if ray_data:  # 64 rows; each worker trains on its shard
        rows = [{"x": [float(i), 1.0, -1.0, 0.5], "y": float(i % 7), "id": i} for i in range(64)]
        datasets["train"] = ray.data.from_items(rows)
    job = TorchTrainer(cluster_fit.fit, train_loop_config=config, datasets=datasets,
                       scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                       torch_config=TorchConfig(backend="gloo"),
                       run_config=RunConfig(storage_path=str(out / "ray"), name="job",
                                            failure_config=FailureConfig(max_failures=0)))  # fmt: skip
    return job.fit()


def assert_bitwise(result_file: Path, expected_file: Path) -> None:
    result, expected = torch.load(result_file), torch.load(expected_file)
    assert (result["world_size"], result["global_step"]) == (2, STEPS) == (expected["world_size"], expected["global_step"])
    for name, value in expected["state_dict"].items():
        assert torch.equal(result["state_dict"][name], value), name


@pytest.mark.timeout(400)
def test_ddp_and_fsdp_in_ray_workers_equal_trainer_run_bitwise(ray_cluster, reference, tmp_path):
    result = fit_on_ray(tmp_path, "ddp,fsdp", ray_data=True)
    assert result.error is None
    for strategy in ("ddp", "fsdp"):
        assert torch.load(tmp_path / strategy / "weights.pt")["environment"] == "RayEnvironment"
        assert_bitwise(tmp_path / strategy / "weights.pt", reference / strategy / "weights.pt")
    # every checkpoint went to Ray too (3 per fit); FSDP's sharded folder arrives whole (each rank reported its
    # shards); the result holds the last one, of the third fit (DDP on Ray Data)
    (fsdp_last,) = (tmp_path / "ray").rglob("report00006-epoch=1-step=15.ckpt")
    assert (fsdp_last / "trainer_checkpoint.txt").read_text() == "epoch=1-step=15.ckpt"
    shards = {p.name for p in (fsdp_last / "epoch=1-step=15.ckpt").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "manifest.json"} <= shards
    assert Path(result.checkpoint.path).name == "report00009-epoch=1-step=15.ckpt"
    # Ray Data as the training data: each worker trains on its own shard (an epoch = 32 rows each, none shared)
    ranks = [torch.load(tmp_path / "ray_data" / f"weights-rank{rank}.pt") for rank in (0, 1)]
    first_epoch = [set(r["seen_ids"][:32]) for r in ranks]
    assert first_epoch[0].isdisjoint(first_epoch[1]) and first_epoch[0] | first_epoch[1] == set(range(64))
    assert ranks[0]["global_step"] == STEPS and all(
        torch.equal(ranks[0]["state_dict"][k], ranks[1]["state_dict"][k]) for k in ranks[0]["state_dict"])


@pytest.mark.timeout(400)
def test_a_failed_worker_group_restarts_and_resumes_exactly_from_rays_checkpoint(ray_cluster, reference, tmp_path):
    # a plain script in 2 Ray Train workers (what `trainer run --ray ADDRESS` runs); rank 1 raises at step 12 of the
    # first attempt, Ray restarts the group (max_failures=1), which resumes from the step-10 checkpoint
    from trainer.integrations.ray import run_script

    result = run_script(str(SCRIPTS / "cluster_fit.py"), [str(tmp_path), "--strategy", "ddp", "--steps", str(STEPS),
                        "--every", str(EVERY), "--fail-at", "12"], num_workers=2, storage_path=str(tmp_path / "ray"),
                        max_failures=1, variables={"TRAINER_ARGS": '{"devices": 2}'})  # fmt: skip
    assert result.error is None
    assert_bitwise(tmp_path / "ddp" / "weights.pt", reference / "ddp" / "weights.pt")
    # Ray's result holds the last checkpoint; the failed attempt's step-10 report is in Ray's storage too
    assert Path(result.checkpoint.path, "trainer_checkpoint.txt").read_text() == "epoch=1-step=15.ckpt"
    assert Path(result.checkpoint.path, "epoch=1-step=15.ckpt").is_file()
    assert any((tmp_path / "ray").rglob("report00002-epoch=1-step=10.ckpt"))


def test_trainer_run_ray_starts_devices_x_nodes_workers_with_the_launch_settings(tmp_path):
    output = run(trainer_command("run", "--ray", "auto", "--devices", "2", "--num-nodes", "2", "--max-restarts", "3",
                                 "--dry-run", str(SCRIPTS / "cluster_fit.py"), "out"), cwd=tmp_path, timeout=60)  # fmt: skip
    plan = json.loads(output.strip().splitlines()[-1])
    assert (plan["ray"], plan["num_workers"], plan["max_failures"]) == ("auto", 4, 3)
    assert json.loads(plan["variables"]["TRAINER_ARGS"]) == {"devices": 2, "num_nodes": 2}
    assert plan["script"][1:] == ["out"]
