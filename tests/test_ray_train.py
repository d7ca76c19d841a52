"""Ray Train on a real local Ray cluster: the same fit inside ``TorchTrainer``'s workers as under ``trainer run``,
bitwise, and a worker group that Ray restarts after a failure resumes exactly from Ray's checkpoint.

One cluster (``ray.init(num_cpus=2)``) serves the module; each ``TorchTrainer.fit`` costs ~30 s here."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from launching import SCRIPTS, run, trainer_command

ray = pytest.importorskip("ray", reason="Ray Train tests need ray (pip install 'trainer[ray]')")
pytest.importorskip("ray.train.torch", reason="Ray Train tests need ray[train]")

STEPS, EVERY = 16, 5  # checkpoints at steps 5, 10, 15; the injected failure at step 12 resumes from step 10


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs whose workers import this tree and the test scripts."""
    paths = [str(Path(__file__).resolve().parents[1]), str(SCRIPTS), str(SCRIPTS.parent)]
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([saved] if saved else []))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield context.address_info["address"]
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same fits under ``trainer run --devices 2`` (torchrun, 2 gloo processes)."""
    out = tmp_path_factory.mktemp("torchrun")
    run(trainer_command("run", "--devices", "2", str(SCRIPTS / "cluster_fit.py"), str(out), "--strategy", "ddp,fsdp",
                        "--steps", str(STEPS), "--every", str(EVERY)), cwd=out, timeout=240)  # fmt: skip
    return out


def fit_on_ray(out: Path, strategy: str, fail_at=None, max_failures: int = 0):
    import sys

    sys.path.insert(0, str(SCRIPTS))
    import cluster_fit
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    config = dict(out=str(out), strategy=strategy, steps=STEPS, every=EVERY, fail_at=fail_at)
    job = TorchTrainer(cluster_fit.fit, train_loop_config=config,
                       scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                       torch_config=TorchConfig(backend="gloo"),
                       run_config=RunConfig(storage_path=str(out / "ray"), name="job",
                                            failure_config=FailureConfig(max_failures=max_failures)))  # fmt: skip
    return job.fit()


def assert_bitwise(result_file: Path, expected_file: Path) -> None:
    result, expected = torch.load(result_file), torch.load(expected_file)
    assert (result["world_size"], result["global_step"]) == (2, STEPS) == (expected["world_size"], expected["global_step"])
    for name, value in expected["state_dict"].items():
        assert torch.equal(result["state_dict"][name], value), name


@pytest.mark.timeout(400)
def test_ddp_and_fsdp_in_ray_workers_equal_trainer_run_bitwise(ray_cluster, reference, tmp_path):
    result = fit_on_ray(tmp_path, "ddp,fsdp")
    assert result.error is None
    for strategy in ("ddp", "fsdp"):
        assert torch.load(tmp_path / strategy / "weights.pt")["environment"] == "RayEnvironment"
        assert_bitwise(tmp_path / strategy / "weights.pt", reference / strategy / "weights.pt")
    # every checkpoint went to Ray too; FSDP's sharded folder arrives whole (each rank reported its shards)
    assert Path(result.checkpoint.path, "trainer_checkpoint.txt").read_text() == "epoch=1-step=15.ckpt"
    reported = Path(result.checkpoint.path, "epoch=1-step=15.ckpt")
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "manifest.json"} <= {p.name for p in reported.iterdir()}


@pytest.mark.timeout(400)
def test_trainer_run_on_ray_restarts_a_failed_group_and_resumes_exactly_from_rays_checkpoint(ray_cluster, reference,
                                                                                            tmp_path):  # fmt: skip
    # `trainer run --ray ADDRESS`: a plain script in 2 Ray Train workers; rank 1 raises at step 12 of the first
    # attempt, Ray restarts the group (--max-restarts 1 = FailureConfig(max_failures=1)), which resumes at step 10
    output = run(trainer_command("run", "--ray", ray_cluster, "--devices", "2", "--max-restarts", "1", "--ray-storage",
                                 str(tmp_path / "ray"), str(SCRIPTS / "cluster_fit.py"), str(tmp_path), "--strategy",
                                 "ddp", "--steps", str(STEPS), "--every", str(EVERY), "--fail-at", "12"),
                 timeout=300, cwd=tmp_path)  # fmt: skip
    assert_bitwise(tmp_path / "ddp" / "weights.pt", reference / "ddp" / "weights.pt")
    last = output.split("[trainer] Ray Train finished; last checkpoint: ")[1].split()[0]
    assert Path(last, "trainer_checkpoint.txt").read_text() == "epoch=1-step=15.ckpt"
    assert Path(last, "epoch=1-step=15.ckpt").is_file()
    # the first attempt failed after its step-10 report: that attempt's reports and the restart's are both there
    assert any((tmp_path / "ray").rglob("report00002-epoch=1-step=10.ckpt"))
