"""Accelerate config files translated to our launch settings and Trainer/Engine arguments, key by key."""
from __future__ import annotations

import pytest
import yaml

from trainer.strategies import ConfigurationError
from trainer.config.accelerate_config import is_accelerate_config, translate_accelerate_config

# What `accelerate config` writes for two machines with four GPUs each.
MULTI_GPU = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
dynamo_backend: 'NO'
deepspeed_config: {}
fsdp_config: {}
gpu_ids: all
machine_rank: 1
main_process_ip: 10.0.0.4
main_process_port: 5000
main_training_function: main
megatron_lm_config: {}
mixed_precision: bf16
num_machines: 2
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def translate(text: str, **changes) -> dict:
    data = yaml.safe_load(text)
    data.update(changes)
    return translate_accelerate_config(data, "acc.yaml")


def test_a_multi_gpu_two_machine_file_maps_every_key():
    assert translate(MULTI_GPU) == {
        "num_nodes": 2, "devices": 4, "node_rank": 1, "main_address": "10.0.0.4", "main_port": 5000,
        "trainer": {"precision": "bf16-mixed", "accelerator": "gpu", "strategy": "ddp"},
    }  # fmt: skip


def test_a_cpu_file_with_fp16_debug_and_threads():
    config = translate("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: fp16\nuse_cpu: true\n"
                       "debug: true\nnum_cpu_threads_per_process: 1\n")  # fmt: skip
    assert config == {
        "num_nodes": 1, "devices": 2, "env": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "OMP_NUM_THREADS": "1"},
        "trainer": {"precision": "16-mixed", "accelerator": "cpu", "strategy": "ddp"},
    }  # fmt: skip


def test_one_process_and_an_unquoted_no():
    config = translate("distributed_type: 'NO'\nnum_processes: 1\nmixed_precision: no\nuse_cpu: true\n")
    assert config == {"num_nodes": 1, "devices": 1, "trainer": {"precision": "32-true", "accelerator": "cpu"}}
    assert is_accelerate_config(yaml.safe_load(MULTI_GPU)) and not is_accelerate_config({"devices": 2})


def test_gpu_ids_become_cuda_visible_devices():
    config = translate(MULTI_GPU, num_machines=1, machine_rank=0, num_processes=2, gpu_ids="2,3")
    assert config["env"] == {"CUDA_VISIBLE_DEVICES": "2,3"} and config["devices"] == 2


# What `accelerate config` writes for DeepSpeed ZeRO-3 with CPU offload on one machine: same_network false as
# every file of that tool carries it, and use_cpu (DeepSpeed's ZeRO runs on CPU ranks with gloo).
DEEPSPEED_CPU = """
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 4
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: false
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


def test_a_deepspeed_file_launches_the_deepspeed_strategy_with_its_settings():
    assert translate(DEEPSPEED_CPU) == {"num_nodes": 1, "devices": 2, "trainer": {
        "precision": "32-true", "accelerator": "cpu", "accumulate_grad_batches": 4,
        "strategy": {"class_path": "trainer.strategies.data_parallel.deepspeed.DeepSpeedStrategy", "init_args": {
            "stage": 3, "offload_optimizer": "cpu", "zero3_init": True, "save_16bit_model": True}}}}  # fmt: skip
    nvme = translate(MULTI_GPU, distributed_type="DEEPSPEED", deepspeed_config={
        "zero_stage": 2, "offload_optimizer_device": "nvme", "offload_optimizer_nvme_path": "/nvme",
        "offload_param_device": "none", "gradient_clipping": 1.0, "deepspeed_multinode_launcher": "standard"})  # fmt: skip
    assert nvme["trainer"]["strategy"]["init_args"] == {"stage": 2, "offload_optimizer": "nvme", "nvme_path": "/nvme",
                                                        "config": {"gradient_clipping": 1.0}}  # fmt: skip
    assert nvme["trainer"]["gradient_clip_val"] == 1.0 and nvme["trainer"]["accelerator"] == "gpu"
    from_file = translate(MULTI_GPU, distributed_type="DEEPSPEED", deepspeed_config={"deepspeed_config_file": "ds.json"})
    assert from_file["trainer"]["strategy"]["init_args"] == {"config": "ds.json", "stage": 2}


def test_the_multi_gpu_file_accelerate_config_writes_with_same_network_false_is_accepted():
    one_machine = MULTI_GPU.replace("machine_rank: 1", "machine_rank: 0").replace("num_machines: 2", "num_machines: 1")
    config = translate(one_machine.replace("num_processes: 8", "num_processes: 2"), same_network=False,
                       enable_cpu_affinity=False, tp_config={}, tpu_vm=None)  # fmt: skip
    assert config == {"num_nodes": 1, "devices": 2, "main_address": "10.0.0.4", "main_port": 5000,
                      "trainer": {"precision": "bf16-mixed", "accelerator": "gpu", "strategy": "ddp"}}  # fmt: skip


def test_fsdp_sharding_strategies_map_and_tuning_keys_are_ignored_with_a_warning():
    fsdp = {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_offload_params": False,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_state_dict_type": "SHARDED_STATE_DICT"}  # fmt: skip
    with pytest.warns(UserWarning, match="fsdp_auto_wrap_policy, fsdp_state_dict_type are ignored"):
        config = translate(MULTI_GPU, distributed_type="FSDP", fsdp_config=fsdp)
    assert config["trainer"]["strategy"] == "zero2"
    assert translate(MULTI_GPU, distributed_type="FSDP", fsdp_config={})["trainer"]["strategy"] == "fsdp"


@pytest.mark.parametrize("changes, key", [
    ({"distributed_type": "XLA"}, "distributed_type: XLA is not supported"),
    ({"mixed_precision": "fp8"}, "mixed_precision: 'fp8' is not supported"),
    ({"num_processes": 7}, "num_processes: 7 processes"),
    ({"machine_rank": 2}, "machine_rank: 2 must be below num_machines: 2"),
    ({"main_process_port": 70000}, "main_process_port: 70000 is not a TCP port"),
    ({"use_cpu": True}, "use_cpu: true contradicts distributed_type: MULTI_GPU"),
    ({"gpu_ids": "0,1"}, "gpu_ids: 2 GPU"),
    ({"rdzv_backend": "c10d"}, "rdzv_backend: 'c10d'"),
    ({"compute_environment": "AMAZON_SAGEMAKER"}, "compute_environment: 'AMAZON_SAGEMAKER' cannot be honoured"),
    ({"downcast_bf16": "yes"}, "downcast_bf16: 'yes' cannot be honoured"),
    ({"enable_cpu_affinity": True}, "enable_cpu_affinity: True cannot be honoured"),
    ({"tpu_use_cluster": True}, "tpu_use_cluster: True cannot be honoured"),
    ({"num_processs": 2}, "num_processs: is not an Accelerate config key.*Did you mean 'num_processes'"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2, "offload_optimizer_device": "disk"}},
     "deepspeed_config.offload_optimizer_device: 'disk' must be none, cpu or nvme"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3, "offload_param_device": "nvme"}},
     "deepspeed_config.offload_param_nvme_path: must name the NVMe folder"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2, "zero3_init_flag": True}},
     "deepspeed_config.zero3_init_flag: true applies to zero_stage 3"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2, "deepspeed_multinode_launcher": "pdsh"}},
     "deepspeed_config.deepspeed_multinode_launcher: 'pdsh'"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 5}}, "deepspeed_config.zero_stage: 5"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 1, "gradient_accumulation_steps": 0}},
     "deepspeed_config.gradient_accumulation_steps: 0 must be an int >= 1"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stag": 2}},
     "deepspeed_config.zero_stag: is not a key.*Did you mean 'zero_stage'"),
    ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_offload_params": True}}, "fsdp_config.fsdp_offload_params"),
    ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "HYBRID_SHARD"}},
     "fsdp_config.fsdp_sharding_strategy: HYBRID_SHARD is not supported"),
])  # fmt: skip
def test_what_cannot_be_honoured_is_an_error_naming_the_key(changes, key):
    with pytest.raises(ConfigurationError, match=f"^acc.yaml: {key}"):
        translate(MULTI_GPU, **changes)


def test_trainer_run_takes_an_accelerate_file_for_its_launch_settings(tmp_path, capsys):
    """The multi-machine file as `trainer run --config`: torchrun's static rendezvous on machine 1 of 2, four
    processes per machine, GPUs 0-3 only, and the Trainer arguments passed on through TRAINER_CONFIG."""
    from trainer.cli import main
    from trainer.config.yaml_config import trainer_settings

    (tmp_path / "acc.yaml").write_text(MULTI_GPU.replace("gpu_ids: all", "gpu_ids: 0,1,2,3"))
    (tmp_path / "train.py").write_text("")
    assert main(["run", "--config", str(tmp_path / "acc.yaml"), "--dry-run", str(tmp_path / "train.py")]) == 0
    out = capsys.readouterr().out
    assert "--nnodes 2 --node-rank 1 --master-addr 10.0.0.4 --master-port 5000 --nproc-per-node 4" in out
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in out and f"TRAINER_CONFIG={tmp_path / 'acc.yaml'}" in out
    assert trainer_settings(tmp_path / "acc.yaml") == {
        "devices": 4, "num_nodes": 2, "precision": "bf16-mixed", "accelerator": "gpu", "strategy": "ddp"}  # fmt: skip
