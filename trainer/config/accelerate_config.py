"""Accelerate config files (the YAML ``accelerate config`` writes) read as our experiment files.

:func:`translate_accelerate_config` maps every key to a launch setting (``num_nodes``, ``devices``,
``node_rank``, ``main_address``, ``main_port``, ``env``) or a Trainer/Engine argument (``accelerator``,
``strategy``, ``precision``, ``accumulate_grad_batches``) and returns a dict in the experiment-file format
(``trainer/config/yaml_config.py``), so ``trainer run --config accelerate.yaml`` launches what ``accelerate launch``
would. Every key ``accelerate config`` writes is read: the ones that change nothing about this launch (TPU settings,
``same_network``, which only steers Accelerate's own rendezvous questions) are accepted, the others honoured; a
value this framework cannot honour is a :class:`ConfigurationError` naming the key and what to do instead; keys
that only tune how Accelerate's FSDP wraps a model are ignored with one warning.

| Accelerate key | ours |
|---|---|
| ``distributed_type`` NO / MULTI_CPU / MULTI_GPU | one process / ``strategy: ddp`` on CPUs / on GPUs |
| ``distributed_type`` DEEPSPEED + ``deepspeed_config`` | ``trainer.strategies.data_parallel.deepspeed.DeepSpeedStrategy`` (``zero_stage``, offload devices and NVMe paths, ``zero3_init_flag``, ``zero3_save_16bit_model``, ``gradient_clipping``, ``deepspeed_config_file``); CPU processes with ``use_cpu: true`` |
| ``distributed_type`` FSDP + ``fsdp_config.fsdp_sharding_strategy`` | FULL_SHARD: ``fsdp``, SHARD_GRAD_OP: ``zero2``, NO_SHARD: ``ddp`` |
| ``num_processes`` (all machines) / ``num_machines`` | ``devices`` (per machine) / ``num_nodes`` |
| ``machine_rank``, ``main_process_ip``, ``main_process_port`` | ``node_rank``, ``main_address``, ``main_port`` |
| ``mixed_precision`` no / fp16 / bf16 | ``precision`` 32-true / 16-mixed / bf16-mixed |
| ``use_cpu`` | ``accelerator: cpu`` |
| ``gpu_ids`` | ``CUDA_VISIBLE_DEVICES`` |
| ``deepspeed_config.gradient_accumulation_steps`` | ``accumulate_grad_batches`` |
| ``deepspeed_config.gradient_clipping`` | ``gradient_clip_val`` (and DeepSpeed's ``gradient_clipping``) |
| ``dynamo_config`` (``dynamo_backend`` and mode/fullgraph/dynamic) | ``compile`` (where the Trainer has it) |
| ``debug`` | ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` |
"""
from __future__ import annotations

import difflib
import warnings
from typing import Any, Mapping

from trainer.strategies.errors import ConfigurationError

DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP")
_PRECISIONS = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}
_ZERO_STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp"}
_FSDP_SHARDING = {"FULL_SHARD": "fsdp", "1": "fsdp", "SHARD_GRAD_OP": "zero2", "2": "zero2", "NO_SHARD": "ddp", "3": "ddp"}
# Values that change nothing here (their defaults, or settings for launches this framework does not do).
_INERT = {
    "compute_environment": ("LOCAL_MACHINE",), "downcast_bf16": ("no", False, None), "tpu_env": ([], None),
    "tpu_use_cluster": (False, None), "tpu_use_sudo": (False, None), "tpu_name": (None, "null"),
    "tpu_zone": (None, "null"), "commands": (None, "null"), "command_file": (None, "null"),
    "enable_cpu_affinity": (False, None),
    "megatron_lm_config": ({}, None), "ipex_config": ({}, None), "mpirun_config": ({}, None),
    "fp8_config": ({}, None), "parallelism_config": ({}, None), "tp_config": ({}, None), "tpu_vm": (None, [], [""]),
    # same_network only decides whether `accelerate config` asks for a rendezvous backend (rdzv_backend, read below)
    "same_network": (True, False, None),
}  # fmt: skip
_HANDLED = ("dynamo_backend", "dynamo_config", "distributed_type", "num_processes", "num_machines", "machine_rank", "main_process_ip",
            "main_process_port", "mixed_precision", "use_cpu", "gpu_ids", "debug", "deepspeed_config", "fsdp_config",
            "rdzv_backend", "main_training_function", "num_cpu_threads_per_process")  # fmt: skip
KNOWN_KEYS = tuple(_INERT) + _HANDLED
_DEEPSPEED_KEYS = ("zero_stage", "offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path",
                   "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping", "zero3_init_flag",
                   "zero3_save_16bit_model", "deepspeed_multinode_launcher", "deepspeed_config_file",
                   "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
                   "deepspeed_moe_layer_cls_names")  # fmt: skip
_DEEPSPEED_CLASS = "trainer.strategies.data_parallel.deepspeed.DeepSpeedStrategy"
# FSDP keys about how Accelerate wraps and saves a model: the fsdp strategy decides these itself.
_FSDP_TUNING = ("fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
                "fsdp_backward_prefetch", "fsdp_backward_prefetch_policy", "fsdp_forward_prefetch",
                "fsdp_state_dict_type", "fsdp_use_orig_params", "fsdp_sync_module_states",
                "fsdp_cpu_ram_efficient_loading", "fsdp_version", "fsdp_reshard_after_forward")  # fmt: skip
_FSDP_KEYS = ("fsdp_sharding_strategy", "fsdp_offload_params", "fsdp_activation_checkpointing") + _FSDP_TUNING


def is_accelerate_config(data: Any) -> bool:
    """True for a parsed YAML mapping written by ``accelerate config`` (it always has ``distributed_type``)."""
    return isinstance(data, Mapping) and ("distributed_type" in data or "compute_environment" in data)


class _Reader:
    """Reads one file's keys, each error naming the key (``section.key`` inside a section) and the file."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def fail(self, key: str, message: str) -> ConfigurationError:
        return ConfigurationError(f"{self.source}: {key}: {message}")

    def int_at_least(self, key: str, low: int, default: int, section: Mapping[str, Any] | None = None,
                     name: str = "") -> int:  # fmt: skip
        value = (self.data if section is None else section).get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.fail(name or key, f"{value!r} must be an int >= {low}.")
        return value


def translate_accelerate_config(data: Mapping[str, Any], source: str = "config") -> dict[str, Any]:
    """An Accelerate config as an experiment-file dict (launch settings and a ``trainer`` section)."""
    read = _Reader(data, source)
    for key in data:
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(str(key), KNOWN_KEYS, n=1)
            raise read.fail(key, "is not an Accelerate config key this launcher knows, so it cannot be honoured."
                                 + (f" Did you mean '{close[0]}'?" if close else "") + " Remove it.")
    for key, inert in _INERT.items():
        if key in data and data[key] not in inert:
            raise read.fail(key, f"{data[key]!r} cannot be honoured here (only {inert[0]!r}); remove the key.")

    kind = data.get("distributed_type", "NO")
    kind = "NO" if kind is False else str(kind).upper()  # YAML reads an unquoted NO as False
    if kind not in DISTRIBUTED_TYPES:
        raise read.fail("distributed_type", f"{kind} is not supported; use one of {', '.join(DISTRIBUTED_TYPES)}.")
    machines = read.int_at_least("num_machines", 1, 1)
    processes = read.int_at_least("num_processes", 1, 1)
    if processes % machines:
        raise read.fail("num_processes", f"{processes} processes (all machines together) cannot be split evenly over "
                                         f"num_machines: {machines}.")  # fmt: skip
    if kind == "NO" and processes > 1:
        raise read.fail("num_processes", f"{processes} with distributed_type: NO (one process). Use MULTI_GPU or "
                                         "MULTI_CPU for several.")  # fmt: skip
    config: dict[str, Any] = {"num_nodes": machines, "devices": processes // machines}
    trainer: dict[str, Any] = {}
    env: dict[str, str] = {}

    rank = read.int_at_least("machine_rank", 0, 0)
    if rank >= machines:
        raise read.fail("machine_rank", f"{rank} must be below num_machines: {machines}.")
    if machines > 1:
        config["node_rank"] = rank
        if data.get("rdzv_backend", "static") not in ("static", None):
            raise read.fail("rdzv_backend", f"{data['rdzv_backend']!r}: several machines meet at main_process_ip:"
                                            "main_process_port (a static rendezvous); use rdzv_backend: static.")  # fmt: skip
    if data.get("main_process_ip") is not None:
        config["main_address"] = str(data["main_process_ip"])
    if data.get("main_process_port") is not None:
        port = read.int_at_least("main_process_port", 1, 0)
        if port > 65535:
            raise read.fail("main_process_port", f"{port} is not a TCP port (1..65535).")
        config["main_port"] = port

    precision = data.get("mixed_precision", "no")
    precision = "no" if precision is False else str(precision).lower()  # YAML reads an unquoted no as False
    if precision not in _PRECISIONS:
        raise read.fail("mixed_precision", f"{precision!r} is not supported; use no, fp16 or bf16.")
    trainer["precision"] = _PRECISIONS[precision]

    use_cpu = bool(data.get("use_cpu", False))
    if kind == "MULTI_CPU" or (use_cpu and kind in ("NO", "DEEPSPEED")):  # DeepSpeed runs CPU ranks with gloo
        trainer["accelerator"] = "cpu"
    elif use_cpu:
        raise read.fail("use_cpu", f"true contradicts distributed_type: {kind} (GPUs). Use MULTI_CPU for CPU processes.")
    elif kind != "NO":
        trainer["accelerator"] = "gpu"
    _gpu_ids(read, data.get("gpu_ids"), trainer.get("accelerator") == "cpu", config["devices"], env)
    if data.get("debug"):
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if data.get("num_cpu_threads_per_process") is not None:
        env["OMP_NUM_THREADS"] = str(read.int_at_least("num_cpu_threads_per_process", 1, 1))

    if kind in ("MULTI_CPU", "MULTI_GPU") and config["num_nodes"] * config["devices"] > 1:
        trainer["strategy"] = "ddp"
    elif kind == "DEEPSPEED":
        trainer.update(_deepspeed(read, data.get("deepspeed_config") or {}, config["num_nodes"]))
    elif kind == "FSDP":
        trainer["strategy"] = _fsdp(read, data.get("fsdp_config") or {})
    compile_options = _dynamo(read, data)
    if compile_options is not None:
        trainer["compile"] = compile_options
    if env:
        config["env"] = env
    config["trainer"] = trainer
    return config


def _gpu_ids(read: _Reader, ids: Any, cpu: bool, devices: int, env: dict[str, str]) -> None:
    if ids is None or str(ids).lower() == "all":
        return
    if cpu:
        raise read.fail("gpu_ids", f"{ids!r} with CPU processes; remove it (or set it to all).")
    listed = [str(i).strip() for i in (ids if isinstance(ids, list) else str(ids).split(",")) if str(i).strip()]
    if not all(i.isdigit() for i in listed):
        raise read.fail("gpu_ids", f"{ids!r} must be 'all' or GPU indices such as '0,1'.")
    if len(listed) < devices:
        raise read.fail("gpu_ids", f"{len(listed)} GPU(s) listed for {devices} processes per machine.")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(listed)


def _deepspeed(read: _Reader, section: Mapping[str, Any], machines: int) -> dict[str, Any]:
    """``deepspeed_config`` → the DeepSpeed strategy (as a ``class_path`` entry) and the Trainer settings it implies."""
    for key in section:
        if key not in _DEEPSPEED_KEYS:
            close = difflib.get_close_matches(str(key), _DEEPSPEED_KEYS, n=1)
            raise read.fail(f"deepspeed_config.{key}", "is not a key `accelerate config` writes, so it cannot be "
                            f"honoured.{' Did you mean ' + repr(close[0]) + '?' if close else ''} Remove it.")  # fmt: skip
    launcher = section.get("deepspeed_multinode_launcher")
    if machines > 1 and launcher not in ("standard", None):
        raise read.fail("deepspeed_config.deepspeed_multinode_launcher", f"{launcher!r}: `trainer run` starts each "
                        "machine's processes itself (torchrun); use 'standard' and run it on every machine.")  # fmt: skip
    if section.get("deepspeed_moe_layer_cls_names"):
        raise read.fail("deepspeed_config.deepspeed_moe_layer_cls_names", "DeepSpeed MoE layers are not set up by "
                        "this strategy; remove the key.")  # fmt: skip
    init_args: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    if section.get("deepspeed_config_file") not in (None, "none"):
        init_args["config"] = str(section["deepspeed_config_file"])
    stage = section.get("zero_stage", 2)
    if stage not in (0, 1, 2, 3):
        raise read.fail("deepspeed_config.zero_stage", f"{stage!r} must be 0, 1, 2 or 3.")
    init_args["stage"] = stage
    paths = []
    for key, argument in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_parameters")):
        device = str(section.get(key) or "none").lower()
        if device not in ("none", "cpu", "nvme"):
            raise read.fail(f"deepspeed_config.{key}", f"{section[key]!r} must be none, cpu or nvme.")
        if device != "none":
            init_args[argument] = device
        if device == "nvme":
            path_key = key.replace("_device", "_nvme_path")
            if not section.get(path_key):
                raise read.fail(f"deepspeed_config.{path_key}", "must name the NVMe folder to offload to.")
            paths.append(str(section[path_key]))
    if len(set(paths)) > 1:
        raise read.fail("deepspeed_config.offload_param_nvme_path", f"{paths[1]!r} differs from "
                        f"offload_optimizer_nvme_path {paths[0]!r}; the strategy offloads both to one nvme_path.")  # fmt: skip
    if paths:
        init_args["nvme_path"] = paths[0]
    if section.get("zero3_init_flag"):
        init_args["zero3_init"] = True
    if section.get("zero3_save_16bit_model"):
        init_args["save_16bit_model"] = True
    for key in ("zero3_init", "save_16bit_model"):
        if init_args.get(key) and stage != 3:
            raise read.fail(f"deepspeed_config.{'zero3_init_flag' if key == 'zero3_init' else 'zero3_save_16bit_model'}",
                            f"true applies to zero_stage 3 (this file has {stage}); set it false.")  # fmt: skip
    clipping = section.get("gradient_clipping")
    if clipping is not None:
        if isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or clipping < 0:
            raise read.fail("deepspeed_config.gradient_clipping", f"{clipping!r} must be a number >= 0.")
        init_args["config"] = {"gradient_clipping": float(clipping)} if "config" not in init_args else init_args["config"]
        settings["gradient_clip_val"] = float(clipping)
    steps = read.int_at_least("gradient_accumulation_steps", 1, 1, section, "deepspeed_config.gradient_accumulation_steps")
    if steps > 1:
        settings["accumulate_grad_batches"] = steps
    return {"strategy": {"class_path": _DEEPSPEED_CLASS, "init_args": init_args}, **settings}


def _dynamo(read: _Reader, data: Mapping[str, Any]) -> Any:
    """``dynamo_config`` (or the older ``dynamo_backend``) → the Trainer's ``compile`` options."""
    section = dict(data.get("dynamo_config") or {})
    if data.get("dynamo_backend") not in (None, "NO", "no"):
        section.setdefault("dynamo_backend", data["dynamo_backend"])
    backend = str(section.get("dynamo_backend", "NO")).lower()
    if backend == "no":
        return None
    options: dict[str, Any] = {"backend": backend}
    for key, option in (("dynamo_mode", "mode"), ("dynamo_use_fullgraph", "fullgraph"), ("dynamo_use_dynamic", "dynamic")):
        if section.get(key) is not None:
            options[option] = section[key]
    return options


def _fsdp(read: _Reader, section: Mapping[str, Any]) -> str:
    for key in section:
        if key not in _FSDP_KEYS:
            raise read.fail(f"fsdp_config.{key}", "cannot be honoured by the fsdp strategy. Remove it.")
    for key in ("fsdp_offload_params", "fsdp_activation_checkpointing"):
        if section.get(key):
            raise read.fail(f"fsdp_config.{key}", "true is not supported; use false.")
    sharding = str(section.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
    if sharding not in _FSDP_SHARDING:
        raise read.fail("fsdp_config.fsdp_sharding_strategy",
                        f"{sharding} is not supported; use FULL_SHARD, SHARD_GRAD_OP or NO_SHARD.")  # fmt: skip
    tuning = [key for key in _FSDP_TUNING if key in section]
    if tuning:
        warnings.warn(f"{read.source}: fsdp_config keys {', '.join(tuning)} are ignored: the fsdp strategy decides "
                      "how the model is wrapped, prefetched and saved.", stacklevel=3)  # fmt: skip
    return _FSDP_SHARDING[sharding]
