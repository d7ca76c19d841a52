"""Cluster environments and the strategy choice they drive, from the environment variables each launcher sets.

No processes are started here: these check what a Trainer decides (and refuses) before any rank exists.
"""
from __future__ import annotations

import pytest
import torch

from trainer.strategies import DDPStrategy, DataParallelStrategy, SingleDeviceStrategy
from trainer.strategies.connector import build_strategy
from trainer.strategies.data_parallel.dp import average_replicas
from trainer.strategies.launch.environments import (
    LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment, detect_environment, expand_nodelist,
)  # fmt: skip
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.launch.launchers import SpawnLauncher, SubprocessScriptLauncher

_JOB_PREFIXES = ("SLURM_", "TORCHELASTIC_")
_JOB_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


@pytest.fixture(autouse=True)
def no_job_variables(monkeypatch):
    """Start every test from a plain shell, even when the suite itself runs under SLURM or torchrun."""
    import os

    for name in list(os.environ):
        if name in _JOB_VARIABLES or name.startswith(_JOB_PREFIXES):
            monkeypatch.delenv(name)


def slurm(monkeypatch, **values: str) -> None:
    base = dict(SLURM_NTASKS="2", SLURM_NNODES="1", SLURM_PROCID="1", SLURM_LOCALID="1", SLURM_NODEID="0",
                SLURM_JOB_ID="123456", SLURM_JOB_NAME="train", SLURM_NODELIST="gpu[07-08]")  # fmt: skip
    base.update(values)
    for key, value in base.items():
        monkeypatch.setenv(key, value)


def torchrun(monkeypatch, world: int = 2, per_node: int = 2, rank: int = 1) -> None:
    for key, value in dict(TORCHELASTIC_RUN_ID="job", RANK=rank, LOCAL_RANK=rank % per_node, WORLD_SIZE=world,
                           LOCAL_WORLD_SIZE=per_node, GROUP_RANK=rank // per_node, MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=29555).items():  # fmt: skip
        monkeypatch.setenv(key, str(value))


# ---------------------------------------------------------------------------------------------- SLURM
@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[01-04,7]", ["node01", "node02", "node03", "node04", "node7"]),
        ("gpu-[9-11]", ["gpu-9", "gpu-10", "gpu-11"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("login", ["login"]),
    ],
)
def test_slurm_nodelists_expand_like_scontrol_show_hostnames(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_slurm_ranks_address_and_port_come_from_the_job(monkeypatch):
    slurm(monkeypatch)
    env = detect_environment()
    assert isinstance(env, SLURMEnvironment)
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (2, 1, 1, 0)
    assert env.main_address == "gpu07"  # the first host of the bracket range
    assert env.main_port == 15000 + 3456  # the same on every task of job 123456
    monkeypatch.setenv("MASTER_PORT", "12345")
    assert env.main_port == 12345


def test_an_interactive_slurm_shell_is_not_a_job_to_join(monkeypatch):
    slurm(monkeypatch, SLURM_JOB_NAME="bash")
    assert detect_environment() is None


def test_slurm_task_count_mismatch_fails_fast_with_matching_sbatch_lines(monkeypatch):
    slurm(monkeypatch, SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0")
    with pytest.raises(ConfigurationError) as err:
        build_strategy("cpu", 2, 2, "ddp")
    message = str(err.value)
    assert "SLURM_NTASKS=1" in message
    assert "#SBATCH --nodes=2" in message and "#SBATCH --ntasks-per-node=2" in message


def test_srun_job_is_joined_with_devices_auto_following_the_tasks_per_node(monkeypatch):
    slurm(monkeypatch, SLURM_NTASKS_PER_NODE="2")
    strategy = build_strategy("cpu", "auto", 1, "auto")
    assert isinstance(strategy, DDPStrategy) and strategy.launcher is None
    assert len(strategy.parallel_devices) == 2 and strategy.global_rank == 1


# ---------------------------------------------------------------------------------------------- torchrun
def test_torchrun_job_is_joined_and_devices_auto_follows_local_world_size(monkeypatch):
    torchrun(monkeypatch)
    strategy = build_strategy("cpu", "auto", 1, "auto")
    assert isinstance(strategy.cluster_environment, TorchElasticEnvironment)
    assert isinstance(strategy, DDPStrategy) and strategy.launcher is None  # never launches more processes
    assert len(strategy.parallel_devices) == 2
    assert (strategy.world_size, strategy.global_rank, strategy.local_rank) == (2, 1, 1)


def test_torchrun_world_size_mismatch_says_what_would_match(monkeypatch):
    torchrun(monkeypatch, world=4, per_node=2, rank=3)
    with pytest.raises(ConfigurationError, match=r"WORLD_SIZE=4.*devices=2, num_nodes=2"):
        build_strategy("cpu", 2, 1, "ddp")


# ---------------------------------------------------------------------------------------------- local launches
def test_plain_python_picks_single_device_or_ddp_by_device_count():
    assert isinstance(build_strategy("cpu", 1, 1, "auto"), SingleDeviceStrategy)
    ddp = build_strategy("cpu", 3, 1, "auto")
    assert isinstance(ddp, DDPStrategy) and isinstance(ddp.launcher, SubprocessScriptLauncher)
    assert ddp.world_size == 3 and ddp.distributed_sampler_kwargs == {"num_replicas": 3, "rank": 0}
    spawn = build_strategy("cpu", 2, 1, "ddp_spawn")
    assert isinstance(spawn.launcher, SpawnLauncher) and spawn.strategy_name == "ddp_spawn"


def test_multi_node_without_node_rank_builds_and_explains_at_launch_how_to_launch_each_node():
    strategy = build_strategy("cpu", 2, 2, "ddp")  # building is fine (as in Lightning): nothing is started yet
    with pytest.raises(ConfigurationError, match="NODE_RANK.*MASTER_ADDR"):
        strategy.launcher.launch(lambda: None)


def test_node_rank_outside_the_node_count_is_refused(monkeypatch):
    monkeypatch.setenv("NODE_RANK", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    with pytest.raises(ConfigurationError, match="NODE_RANK=2"):
        build_strategy("cpu", 1, 2, "ddp")


def test_processes_launched_on_the_second_node_get_global_ranks_after_the_first(monkeypatch):
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    env = LocalEnvironment()
    env.validate(num_devices=2, num_nodes=2)
    first, second = env.launch_variables(0), env.launch_variables(1)
    assert (first["RANK"], second["RANK"], second["WORLD_SIZE"]) == ("2", "3", "4")
    assert second["MASTER_ADDR"] == "10.0.0.1" and second["MASTER_PORT"] == "29500"  # same port on every node


def test_a_launched_process_joins_instead_of_launching_again(monkeypatch):
    for key, value in dict(LOCAL_RANK="1", RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1234").items():
        monkeypatch.setenv(key, value)
    strategy = build_strategy("cpu", 2, 1, "auto")
    assert isinstance(strategy, DDPStrategy) and strategy.launcher is None and strategy.global_rank == 1
    with pytest.raises(ConfigurationError, match="WORLD_SIZE=2"):
        build_strategy("cpu", 3, 1, "ddp")  # a second Trainer in the script must agree with the job


# ---------------------------------------------------------------------------------------------- misuse
def test_dp_without_gpus_recommends_ddp():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: dp is allowed")
    with pytest.raises(ConfigurationError, match="strategy='ddp'"):
        build_strategy("cpu", 2, 1, "dp")


def test_nccl_on_cpu_and_unknown_options_are_refused():
    with pytest.raises(ConfigurationError, match="nccl"):
        build_strategy("cpu", 2, 1, DDPStrategy(process_group_backend="nccl"))
    with pytest.raises(ConfigurationError, match="start_method"):
        DDPStrategy(start_method="thread")
    with pytest.raises(ConfigurationError, match="timeout"):
        DDPStrategy(timeout=-1)
    with pytest.raises(ConfigurationError, match="op='median'"):
        DDPStrategy().reduce(torch.ones(1), op="median")


def test_dp_averages_the_per_gpu_losses_it_gathers():
    # DataParallel gathers one scalar loss per GPU into a vector; the step must see their mean.
    gathered = torch.tensor([1.0, 3.0])
    assert average_replicas(gathered, 2).item() == 2.0
    assert average_replicas({"loss": gathered, "n": 4}, 2)["loss"].item() == 2.0
    single = torch.tensor(5.0)
    assert average_replicas(single, 1) is single
    assert DataParallelStrategy.strategy_name == "dp"


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL DDP and DataParallel); none here")
def test_cuda_devices_get_nccl_and_one_gpu_per_rank():
    ddp = build_strategy("gpu", 2, 1, "ddp")
    assert ddp.process_group_backend_name == "nccl"
    assert ddp.parallel_devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    dp = build_strategy("gpu", 2, 1, "dp")
    assert isinstance(dp, DataParallelStrategy) and dp.root_device == torch.device("cuda", 0)
