"""Kubernetes (Kubeflow): pods started as local processes with exactly the variables Kubeflow gives them train
one job of the right size and ranks; ``trainer k8s`` writes manifests with the fields Kubeflow requires."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from launching import SCRIPTS, finish, start, trainer_command, run
from trainer.cli.env import collect
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.launch.environments import (
    KubeflowEnvironment, LocalEnvironment, SkyPilotEnvironment, TorchElasticEnvironment, detect_environment,
)  # fmt: skip
from trainer.strategies.launch.environments.local import find_free_port

_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PET_", "SKYPILOT_", "TRAINER_")
_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
          "MASTER_PORT")  # fmt: skip


def plain_environment() -> dict[str, str]:
    """This process's environment without any job's variables (the suite may itself run under a launcher)."""
    return {k: v for k, v in os.environ.items() if k not in _NAMES and not k.startswith(_PREFIXES)}


@pytest.fixture
def no_job_variables(monkeypatch):
    for name in list(os.environ):
        if name in _NAMES or name.startswith(_PREFIXES):
            monkeypatch.delenv(name)


def start_pods(out: Path, pod_variables: list[dict[str, str]], command: list[str]) -> None:
    """Start one process per pod with exactly its variables, and wait for all (a hang fails within 180 s)."""
    pods = [start(command, env={**plain_environment(), **variables}, cwd=out) for variables in pod_variables]
    for pod in pods:
        finish(pod, timeout=180)


def assert_one_job_of_four(folder: Path) -> None:
    reports = [torch.load(folder / f"weights-rank{rank}.pt") for rank in range(4)]
    # (global, local, node): pod index x 2 + local rank
    assert sorted(r["ranks"] for r in reports) == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert {r["world_size"] for r in reports} == {4}
    for report in reports[1:]:
        for name, value in reports[0]["state_dict"].items():
            assert torch.equal(report["state_dict"][name], value), name
    return reports[0]


def test_pytorchjob_v1_pods_start_their_processes_and_number_ranks_pod_by_pod(tmp_path):
    port = str(find_free_port())
    pods = [dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", RANK=str(pod)) for pod in (0, 1)]
    command = [sys.executable, str(SCRIPTS / "cluster_fit.py"), str(tmp_path), "--devices", "2", "--num-nodes", "2",
               "--strategy", "ddp", "--steps", "6"]  # fmt: skip
    start_pods(tmp_path, pods, command)
    rank0 = assert_one_job_of_four(tmp_path / "ddp")
    assert rank0["environment"] == "KubeflowEnvironment" and rank0["global_step"] == 6


def test_trainjob_v2_pods_run_torchrun_from_pet_variables(tmp_path):
    port = str(find_free_port())
    pods = [dict(PET_NNODES="2", PET_NPROC_PER_NODE="2", PET_NODE_RANK=str(pod), PET_MASTER_ADDR="127.0.0.1",
                 PET_MASTER_PORT=port) for pod in (0, 1)]  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", str(SCRIPTS / "cluster_fit.py"), str(tmp_path),
               "--devices", "2", "--num-nodes", "2", "--strategy", "ddp", "--steps", "6"]  # fmt: skip
    start_pods(tmp_path, pods, command)
    rank0 = assert_one_job_of_four(tmp_path / "ddp")
    assert rank0["environment"] == "TorchElasticEnvironment"


def test_pod_variables_give_node_level_ranks_and_clear_errors(no_job_variables, monkeypatch):
    for key, value in dict(MASTER_ADDR="10.0.0.5", MASTER_PORT="23456", WORLD_SIZE="3", RANK="2").items():
        monkeypatch.setenv(key, value)
    env = detect_environment()
    assert isinstance(env, KubeflowEnvironment) and not env.creates_processes_externally
    shown = collect()["cluster"]  # `trainer env`
    assert (shown["name"], shown["nodes"], shown["node_rank"]) == ("KubeflowEnvironment", 3, 2)
    env.validate(4, 3)
    assert (env.world_size(), env.node_rank(), env.global_rank(), env.main_address, env.main_port) == (12, 2, 8, "10.0.0.5", 23456)
    with pytest.raises(ConfigurationError, match=r"3 node\(s\).*num_nodes=2.*Set Trainer\(num_nodes=3\)"):
        KubeflowEnvironment().validate(4, 2)
    # a newer operator with nprocPerNode: WORLD_SIZE counts every process, PET_* says what a pod is
    for key, value in dict(WORLD_SIZE="12", RANK="8", PET_NNODES="3", PET_NODE_RANK="2", PET_NPROC_PER_NODE="4",
                           PET_MASTER_ADDR="10.0.0.5", PET_MASTER_PORT="23456").items():  # fmt: skip
        monkeypatch.setenv(key, value)
    env = detect_environment()
    env.validate(4, 3)
    assert (env.world_size(), env.node_rank(), env.global_rank()) == (12, 2, 8)
    with pytest.raises(ConfigurationError, match="PET_NPROC_PER_NODE|4 processes per node"):
        KubeflowEnvironment().validate(2, 3)
    monkeypatch.setenv("LOCAL_RANK", "1")  # a process the Trainer started in the pod joins as a local launch
    assert type(detect_environment()) is LocalEnvironment
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # TrainJob's torchrun
    assert type(detect_environment()) is TorchElasticEnvironment


def test_skypilot_nodes_wire_the_rendezvous_from_node_ips(no_job_variables, monkeypatch):
    for key, value in dict(SKYPILOT_NODE_RANK="1", SKYPILOT_NODE_IPS="10.1.0.7\n10.1.0.9\n", SKYPILOT_NUM_NODES="2",
                           SKYPILOT_NUM_GPUS_PER_NODE="8").items():  # fmt: skip
        monkeypatch.setenv(key, value)
    env = detect_environment()
    assert isinstance(env, SkyPilotEnvironment) and collect()["cluster"]["name"] == "SkyPilotEnvironment"
    env.validate(8, 2)
    assert (env.world_size(), env.global_rank(), env.main_address, env.main_port) == (16, 8, "10.1.0.7", 29500)
    assert env.launch_variables(3)["RANK"] == "11" and env.launch_variables(3)["MASTER_ADDR"] == "10.1.0.7"
    with pytest.raises(ConfigurationError, match=r"Set Trainer\(num_nodes=2\)"):
        env.validate(8, 1)
    monkeypatch.setenv("SKYPILOT_NODE_IPS", "10.1.0.7")
    with pytest.raises(ConfigurationError, match="SKYPILOT_NODE_IPS lists 1"):
        SkyPilotEnvironment()


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_trainer_k8s_writes_a_manifest_kubeflow_accepts(kind, tmp_path):
    out = tmp_path / "job.yaml"
    run(trainer_command("k8s", "train.py", "--nodes", "2", "--devices-per-node", "8", "--image", "reg.io/me/train:1",
                        "--kind", kind, "--pvc", "ckpts", "-o", str(out), "--", "--lr", "0.1"), cwd=tmp_path, timeout=60)  # fmt: skip
    doc = yaml.safe_load(out.read_text())
    assert doc["metadata"]["name"] == "train"
    if kind == "pytorchjob":
        assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
        specs = doc["spec"]["pytorchReplicaSpecs"]
        assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 1)
        for replica in specs.values():
            pod = replica["template"]["spec"]
            (container,) = pod["containers"]
            assert container["name"] == "pytorch" and container["image"] == "reg.io/me/train:1"
            assert container["command"] == ["python", "train.py", "--lr", "0.1"]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
            assert pod["terminationGracePeriodSeconds"] >= 60
            assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "ckpts"
            assert container["volumeMounts"][0]["mountPath"] == "/checkpoints"
            env = {item["name"]: item["value"] for item in container["env"]}
    else:
        assert (doc["apiVersion"], doc["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
        spec = doc["spec"]
        assert spec["runtimeRef"]["name"] == "torch-distributed"
        trainer = spec["trainer"]
        assert (trainer["numNodes"], trainer["numProcPerNode"], trainer["image"]) == (2, 8, "reg.io/me/train:1")
        assert trainer["command"][:2] == ["torchrun", "/workspace/train.py"]
        assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
        assert spec["podSpecOverrides"][0]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "ckpts"
        env = {item["name"]: item["value"] for item in trainer["env"]}
    assert env["TRAINER_AUTO_RESUME"] == "1"
    assert '"num_nodes": 2' in env["TRAINER_ARGS"] and '"default_root_dir": "/checkpoints"' in env["TRAINER_ARGS"]


def test_trainer_k8s_prints_the_manifest_with_dash(tmp_path):
    printed = run(trainer_command("k8s", "train.py", "--image", "img", "--accelerator", "cpu", "-o", "-"), cwd=tmp_path,
                  timeout=60)  # fmt: skip
    doc = yaml.safe_load(printed)
    assert doc["kind"] == "PyTorchJob" and "Worker" not in doc["spec"]["pytorchReplicaSpecs"]  # one pod
    assert "resources" not in doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert not list(tmp_path.iterdir())


def test_trainer_k8s_refuses_a_name_kubernetes_refuses(tmp_path):
    process = start(trainer_command("k8s", "Train_Model.py", "--image", "x", "--job-name", "Bad_Name"), cwd=tmp_path)
    output = finish(process, timeout=60, expect=2)
    assert "is not a Kubernetes name" in output and "--job-name" in output


def test_a_restarted_pod_resumes_from_the_newest_checkpoint(no_job_variables, monkeypatch, tmp_path, capsys):
    from helpers import Regressor, loader, quiet_trainer

    monkeypatch.setenv("TRAINER_AUTO_RESUME", "1")  # what `trainer k8s` manifests export
    first = quiet_trainer(max_steps=3, enable_checkpointing=True, default_root_dir=tmp_path)
    first.fit(Regressor(), loader())  # the pod's first start: nothing to resume, training starts over
    assert first.ckpt_path is None and "training starts over" in capsys.readouterr().out
    again = quiet_trainer(max_steps=5, enable_checkpointing=True, default_root_dir=tmp_path)
    again.fit(Regressor(), loader())  # the restarted pod
    assert "TRAINER_AUTO_RESUME=1" in capsys.readouterr().out and again.ckpt_path is not None
    assert again.global_step == 5
