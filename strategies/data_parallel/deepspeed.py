"""``strategy="deepspeed"`` (``DeepSpeedStrategy``): ZeRO stages 0-3 and CPU/NVMe offload through the optional
``deepspeed`` package (``pip install 'trainer[deepspeed]'``). Imported only when chosen.

From the Trainer:

- **precision**: "16-mixed" becomes DeepSpeed's ``fp16`` (its own dynamic loss scaling), "bf16-mixed" its ``bf16``;
  DeepSpeed then keeps the module in that dtype and float32 master weights in its optimizer, and batches are
  cast to it. "32-true" uses neither. Other precisions raise.
- **gradient accumulation**: the Trainer's loop runs the window and tells DeepSpeed which micro-batch ends it
  (``engine.set_gradient_accumulation_boundary``), so the config's ``gradient_accumulation_steps`` stays 1.

From the strategy's arguments (over the user's ``config``, a dict or a JSON file): ``stage``,
``offload_optimizer``, ``offload_parameters`` ("cpu", or "nvme" with ``nvme_path``). Gradient clipping is
DeepSpeed's, done inside its step: set ``config={"gradient_clipping": 1.0}``; ``Trainer(gradient_clip_val=...)``
must then be unset or equal. ``"auto"`` values in a config (as Accelerate's templates write them) are left to
DeepSpeed's defaults, or taken from the Trainer (precision, clipping).

On CPU devices (gloo, ``accelerator="cpu"``) DeepSpeed runs with its CPU accelerator (``DS_ACCELERATOR=cpu`` is set
before it is imported); ZeRO 1-3 work, and so does optimizer offload, where the module's own torch optimizer
steps (DeepSpeed's fused CPU Adam is for GPU runs, whose optimizer would otherwise step on the CPU slowly).

Checkpoints are DeepSpeed's own folders (each rank writes its partition; ``engine.save_checkpoint``) with the
rest of the Trainer's checkpoint as DeepSpeed's client state, swapped into place atomically; ``ckpt_path`` and
``"last"`` resume from them. DeepSpeed reads them with its own (pickle-based) loader: load only folders you
trust. Its ``zero_to_fp32.py`` (written into each folder) turns one into full float32 weights.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Union

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from trainer.strategies.checkpoint.checkpoint_io import replace_folder, temporary_name
from trainer.strategies.launch.environments import ClusterEnvironment
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.parallel import ParallelStrategy
from trainer.strategies.precision import HalfPrecision, Precision
from trainer.strategies.data_parallel.redirection import ForwardRedirection

_TAG = "checkpoint"
_NULL_CONTEXT = contextlib.nullcontext()
_DTYPES = {"16-mixed": ("fp16", "16-true"), "bf16-mixed": ("bf16", "bf16-true")}


class DeepSpeedStrategy(ParallelStrategy):
    """DeepSpeed ZeRO data parallelism.

    Args:
        stage: ZeRO stage 0 (plain data parallel), 1 (optimizer state sharded), 2 (and gradients), 3 (and parameters).
        offload_optimizer: keep optimizer state in CPU memory and step there (True or "cpu"), or on NVMe ("nvme").
        offload_parameters: keep parameters in CPU memory (stage 3; True/"cpu", or "nvme").
        nvme_path: the folder NVMe offload writes to (needed for "nvme").
        zero3_init: stage 3: build the module's layers already partitioned (``deepspeed.zero.Init``) where the
            strategy's init context is used (:meth:`module_init_context`).
        save_16bit_model: stage 3: each checkpoint folder also gets the gathered weights (``pytorch_model.bin``).
        config: a DeepSpeed config dict or the path of a JSON file; the arguments above override its
            ``zero_optimization`` entries, the Trainer's precision overrides ``fp16``/``bf16``.
        timeout / process_group_backend / cluster_environment: as for ``DDPStrategy``.
    """

    strategy_name = "deepspeed"
    is_sharded = True
    restore_checkpoint_after_setup = True  # DeepSpeed's engine, made with the optimizer, reads its folders

    def __init__(
        self,
        stage: int = 2,
        offload_optimizer: Union[bool, str] = False,
        offload_parameters: Union[bool, str] = False,
        config: Union[None, dict[str, Any], str, os.PathLike] = None,
        nvme_path: Optional[str] = None,
        zero3_init: bool = False,
        save_16bit_model: bool = False,
        timeout: Union[None, float, datetime.timedelta] = None,
        process_group_backend: Optional[str] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        precision: Optional[Precision] = None,
    ) -> None:
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:  # imported later: DS_ACCELERATOR must be set first
            raise ConfigurationError(
                "strategy='deepspeed' needs the deepspeed package. Install it with `pip install 'trainer[deepspeed]'`, "
                "or use strategy='fsdp'/'zero2', which need only torch."
            )
        super().__init__(cluster_environment, process_group_backend, timeout, "popen", precision)
        if stage not in (0, 1, 2, 3):
            raise ConfigurationError(f"DeepSpeedStrategy(stage={stage!r}): ZeRO stages are 0 (off), 1, 2 and 3.")
        self.offload_optimizer = _offload_device("offload_optimizer", offload_optimizer)
        self.offload_parameters = _offload_device("offload_parameters", offload_parameters)
        if self.offload_parameters and stage != 3:
            raise ConfigurationError("offload_parameters needs stage=3 (only stage 3 partitions parameters).")
        if "nvme" in (self.offload_optimizer, self.offload_parameters) and not nvme_path:
            raise ConfigurationError("Offloading to 'nvme' needs nvme_path= (a folder on the NVMe drive).")
        if (zero3_init or save_16bit_model) and stage != 3:
            raise ConfigurationError("zero3_init and save_16bit_model apply to stage=3 (parameters partitioned).")
        self.stage = stage
        self.nvme_path = nvme_path
        self.zero3_init = bool(zero3_init)
        self.save_16bit_model = bool(save_16bit_model)
        self.user_config = _read_config(config)
        self.config: dict[str, Any] = {}
        self._engine: Any = None
        self._run_training_step: Optional[ForwardRedirection] = None
        self._cast: Optional[HalfPrecision] = None

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        super().connect(devices, num_nodes, precision)
        kind = devices[0].type if devices else "cpu"
        if kind == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read when deepspeed is first imported
        import sys

        if "deepspeed" in sys.modules:  # imported before (by the user): its accelerator was chosen then
            from deepspeed.accelerator import get_accelerator

            chosen = get_accelerator().device_name()
            if chosen != kind:
                raise ConfigurationError(
                    f"deepspeed was imported with its {chosen!r} accelerator, but the devices are {kind!r}. Set "
                    f"DS_ACCELERATOR={kind} before deepspeed is imported (or import it after creating the Trainer)."
                )

    def build_config(self) -> dict[str, Any]:
        """The DeepSpeed config: the user's, with this strategy's ZeRO settings and the Trainer's precision."""
        config = json.loads(json.dumps(self.user_config))  # a deep copy of plain JSON values
        steps = config.get("gradient_accumulation_steps", 1)
        if steps not in (1, "auto"):
            raise ConfigurationError(
                f"The DeepSpeed config sets gradient_accumulation_steps={steps}; the Trainer runs accumulation. Remove "
                f"it and pass Trainer(accumulate_grad_batches={steps})."
            )
        config["gradient_accumulation_steps"] = 1
        config.setdefault("train_micro_batch_size_per_gpu", 1)  # DeepSpeed requires it; only its own timers read it
        config.setdefault("zero_allow_untested_optimizer", True)  # any torch optimizer (as Lightning's default)
        config.pop("train_batch_size", None)
        for key in [k for k, v in config.items() if v == "auto"]:  # Accelerate-style templates
            if key == "gradient_clipping":
                config[key] = 0.0
            else:
                config.pop(key)
        if "optimizer" in config or "scheduler" in config:
            raise ConfigurationError(
                "The DeepSpeed config has an 'optimizer'/'scheduler' section; the Trainer hands DeepSpeed the optimizer "
                "and schedulers configure_optimizers returns. Move them there and remove the sections."
            )
        zero = config.setdefault("zero_optimization", {})
        for key in [k for k, v in zero.items() if v == "auto"]:
            zero.pop(key)  # sizes Accelerate derives from the model: DeepSpeed's defaults
        zero["stage"] = self.stage
        if self.save_16bit_model:
            zero["stage3_gather_16bit_weights_on_model_save"] = True
        pin = self.root_device.type == "cuda"  # pinned host memory speeds up GPU<->CPU copies only
        if self.offload_optimizer:
            zero["offload_optimizer"] = self._offload(self.offload_optimizer, pin)
            if self.root_device.type == "cpu":  # the optimizer already steps on the CPU: DeepSpeed's CPU Adam adds nothing
                config.setdefault("zero_force_ds_cpu_optimizer", False)
        if self.offload_parameters:
            zero["offload_param"] = self._offload(self.offload_parameters, pin)
        name = self.precision.name
        if name not in ("32-true", *_DTYPES):
            raise ConfigurationError(
                f"strategy='deepspeed' supports precision '32-true', '16-mixed' and 'bf16-mixed' (DeepSpeed keeps "
                f"float32 master weights itself), not {name!r}."
            )
        for key, _ in _DTYPES.values():
            config.pop(key, None)
        if name in _DTYPES:
            key, half = _DTYPES[name]
            config[key] = {"enabled": True}
            self._cast = HalfPrecision(half)
        return config

    def _offload(self, device: str, pin: bool) -> dict[str, Any]:
        settings: dict[str, Any] = {"device": device, "pin_memory": pin}
        if device == "nvme":
            settings["nvme_path"] = self.nvme_path
        return settings

    def module_init_context(self) -> ContextManager:
        """Where the module's layers are built (``configure_model``): with ``zero3_init``, partitioned at creation."""
        if not self.zero3_init:
            return _NULL_CONTEXT
        import deepspeed

        return deepspeed.zero.Init(config_dict_or_path=self.build_config(), remote_device=self.offload_parameters or None)

    # ------------------------------------------------------------------ module and optimizers
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Keep the module; DeepSpeed wraps it together with the optimizer in ``setup_optimizers``."""
        if self._engine is not None and self._engine.module is module:
            self.model = self._engine  # a later stage with the module DeepSpeed already holds
            return self.model
        self.module = self.model = module.to(self.root_device)
        self._engine = None
        return module

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        """``deepspeed.initialize`` with the module and its one optimizer; returns DeepSpeed's optimizer."""
        import deepspeed

        if len(optimizers) != 1:
            raise ConfigurationError(
                f"strategy='deepspeed' drives exactly one optimizer; configure_optimizers returned {len(optimizers)}."
            )
        self.config = self.build_config()
        engine, optimizer, _, _ = deepspeed.initialize(model=self.module, optimizer=optimizers[0], config=self.config,
                                                       dist_init_required=False)  # fmt: skip
        self._engine = self.model = engine
        self._run_training_step = ForwardRedirection(engine, self.module, "training_step")
        return super().setup_optimizers([optimizer])

    def batch_to_device(self, batch: Any) -> Any:
        batch = super().batch_to_device(batch)
        return self._cast.convert_input(batch) if self._cast is not None else batch

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any) -> Any:
        """``module.training_step`` through the engine's forward (DeepSpeed's hooks run around it)."""
        if self._run_training_step is None:
            return self.module.training_step(*args)
        return self._run_training_step(*args)

    def evaluation_step(self, step_name: str, *args: Any) -> Any:
        return getattr(self.module, step_name)(*args)

    def backward_sync(self, should_sync: bool, model: Optional[nn.Module] = None) -> ContextManager:
        """Tell DeepSpeed whether this micro-batch ends the Trainer's accumulation window."""
        if self._engine is not None:
            self._engine.set_gradient_accumulation_boundary(should_sync)
        return _NULL_CONTEXT

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """DeepSpeed's backward (it scales the loss under fp16; the Trainer already divided it for accumulation)."""
        self._engine.backward(loss, *args, **kwargs)

    def backward_through(self, backward: Callable[..., Any], loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """DeepSpeed's engine runs the backward (it owns the loss scaling): a module's own ``backward`` is not
        called; a warning says so once, as in Lightning."""
        if not getattr(self, "_warned_backward", False):
            self._warned_backward = True
            warnings.warn("The module overrides backward(), but strategy='deepspeed' runs the backward through its "
                          "engine: the override is not called.", UserWarning, stacklevel=2)
        self.backward(loss, *args, **kwargs)

    def optimizer_step(
        self, optimizer: Optimizer, before_step: Callable[[], None], closure: Optional[Callable[[], Any]] = None,
        **kwargs: Any,
    ) -> bool:
        """Hooks, then DeepSpeed's step (unscale, clip, step, zero the gradients). False when fp16 skipped it.
        DeepSpeed's engine takes no step arguments: ``kwargs`` are refused."""
        if kwargs:
            raise ConfigurationError(f"strategy='deepspeed' steps its own engine: optimizer.step() takes no extra "
                                     f"arguments there (got {sorted(kwargs)}).")  # fmt: skip
        if closure is not None:
            raise ConfigurationError("strategy='deepspeed' does not support optimizer.step(closure); call the closure "
                                     "yourself, then optimizer.step().")  # fmt: skip
        before_step()
        self._engine.step()
        return bool(self._engine.was_step_applied())

    def clip_gradients(self, optimizer: Optimizer, clip_val: float, algorithm: str = "norm") -> Optional[Tensor]:
        """DeepSpeed clips inside its step, by norm, at the config's ``gradient_clipping``."""
        configured = self.config.get("gradient_clipping", 0.0)
        if algorithm != "norm" or float(configured) != float(clip_val):
            raise ConfigurationError(
                f"DeepSpeed clips gradients inside its optimizer step (by norm, at gradient_clipping={configured}). "
                f"Pass DeepSpeedStrategy(config={{'gradient_clipping': {clip_val}}}) and leave Trainer("
                "gradient_clip_val=...) unset or equal to it (gradient_clip_algorithm='norm')."
            )
        return None

    # ------------------------------------------------------------------ checkpoints
    def module_state_dict(self, module: Optional[nn.Module] = None) -> dict[str, Any]:
        """The module's state dict as this rank holds it (stage 3: its partitions); checkpoints use DeepSpeed's."""
        return (self.module if module is None else module).state_dict()

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """Empty: DeepSpeed writes each rank's optimizer partition into the checkpoint folder itself."""
        return {}

    def load_module_state_dict(
        self, state_dict: dict[str, Any], strict: bool = True, module: Optional[nn.Module] = None
    ) -> Any:
        """Nothing to do after ``load_checkpoint``: DeepSpeed restored the module."""

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Nothing to do after ``load_checkpoint``: DeepSpeed restored the optimizer."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
        """A DeepSpeed checkpoint folder (every rank writes its partition), swapped into ``path`` by rank 0."""
        if self._engine is None:
            raise ConfigurationError("strategy='deepspeed' saves checkpoints during fit (DeepSpeed holds the state).")
        target = Path(path)
        tmp = Path(self.broadcast(str(temporary_name(target))))
        rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        self._engine.save_checkpoint(str(tmp), tag=_TAG, client_state={"trainer": rest}, save_latest=False)
        if self.save_16bit_model:  # gathered on rank 0 (every rank takes part)
            self._engine.save_16bit_model(str(tmp), "pytorch_model.bin")
        self.barrier("deepspeed.save_checkpoint")
        if self.is_global_zero:
            replace_folder(tmp, target)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore module and optimizer from a DeepSpeed folder; returns the Trainer's part of the checkpoint."""
        if self._engine is None or not (Path(path) / _TAG).is_dir():
            raise ConfigurationError(
                f"strategy='deepspeed' resumes fits from its own checkpoint folders; '{path}' is not one (or this is "
                "not a fit). To start from full weights, load them into the module before fit: "
                "module.load_state_dict(torch.load(path, weights_only=True)['state_dict'])."
            )
        _, client = self._engine.load_checkpoint(str(path), tag=_TAG, load_lr_scheduler_states=False)
        checkpoint = dict(client["trainer"])
        checkpoint["state_dict"] = self.module.state_dict()
        checkpoint["optimizer_states"] = [{} for _ in range(len(self._optimizers_or_none()))]
        return checkpoint

    def _optimizers_or_none(self) -> list[Any]:
        return [self._engine.optimizer] if self._engine is not None and self._engine.optimizer is not None else []

    def teardown(self) -> None:
        self._run_training_step = None
        super().teardown()


def _read_config(config: Union[None, dict[str, Any], str, os.PathLike]) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return config
    path = Path(config)
    if not path.is_file():
        raise ConfigurationError(f"DeepSpeedStrategy(config={str(config)!r}): no such JSON file.")
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigurationError(f"DeepSpeed config '{path}' is not valid JSON: {err}.") from None
    if not isinstance(loaded, dict):
        raise ConfigurationError(f"DeepSpeed config '{path}' must hold a JSON object.")
    return loaded


def _offload_device(name: str, value: Union[bool, str, None]) -> str:
    """``True``/"cpu" → "cpu", "nvme" → "nvme", False/None/"none" → "" (no offload)."""
    if value is True:
        return "cpu"
    if value in (False, None) or str(value).lower() == "none":
        return ""
    if str(value).lower() in ("cpu", "nvme"):
        return str(value).lower()
    raise ConfigurationError(f"DeepSpeedStrategy({name}={value!r}) must be False, True/'cpu' or 'nvme'.")


def build_cpu_ops() -> None:
    """Compile the op DeepSpeed's CPU backend loads when its process group starts (its shared-memory collectives).

    DeepSpeed builds it just in time, in the first job that needs it: a minute or more of compiling on a small
    machine, inside that job's time, and a job killed meanwhile leaves a lock that makes the next one wait forever.
    ``make install`` runs this once (``python -m trainer.strategies.data_parallel.deepspeed``); the build is cached in
    torch's extension folder, ``TORCH_EXTENSIONS_DIR`` (the Makefile and the tests set it to ``.venv/torch_extensions``,
    so another environment's build in the shared ``~/.cache/torch_extensions`` is never mixed up with this one).
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    removed = remove_stale_build_locks()
    if removed:
        print(f"Removed the lock of a build that was killed midway: {', '.join(removed)}")
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    builder = ShareMemCommBuilder()
    if builder.is_compatible():
        builder.load(verbose=False)
        print(f"DeepSpeed's CPU collectives are built in {os.environ.get('TORCH_EXTENSIONS_DIR') or '~/.cache/torch_extensions'}")


#: No build of an extension takes this long; a ``lock`` older than this was left by a build that was killed.
STALE_LOCK_SECONDS = 900.0


def remove_stale_build_locks(root: Optional[str] = None, older_than: float = STALE_LOCK_SECONDS) -> list[str]:
    """Delete the ``lock`` files that torch's extension builder leaves when a build is killed midway (every later
    build of that extension waits on it forever). A lock is stale once it is older than any build takes; ``root``
    defaults to ``TORCH_EXTENSIONS_DIR`` (nothing happens when it is not set). Returns the paths removed."""
    import time

    root = root or os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root or not os.path.isdir(root):
        return []
    removed = []
    now = time.time()
    for name in sorted(os.listdir(root)):
        lock = os.path.join(root, name, "lock")
        try:
            if now - os.path.getmtime(lock) > older_than:
                os.remove(lock)
                removed.append(lock)
        except OSError:  # no lock, or another process removed it first
            continue
    return removed


if __name__ == "__main__":
    build_cpu_ops()
