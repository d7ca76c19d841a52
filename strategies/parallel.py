"""What every multi-process strategy shares: topology from a cluster environment, a launcher when nothing
else started the processes, the process group and the collectives. ``DDPStrategy`` adds the module wrapping."""
from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from trainer.strategies.launch import hang_report
from trainer.strategies.launch.environments import ClusterEnvironment, LocalEnvironment, detect_environment
from trainer.strategies.checkpoint.whole_folder import WholeFolderLoading
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision import Precision
from trainer.strategies.rank import rank_zero_only
from trainer.strategies.strategy import Strategy

START_METHODS = ("popen", "spawn", "fork", "forkserver")
_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


def _as_timedelta(timeout: Union[None, float, int, datetime.timedelta]) -> Optional[datetime.timedelta]:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds or a datetime.timedelta.")
    return datetime.timedelta(seconds=timeout)


def _distributed_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size_of_job() -> int:
    """Processes in the default process group (1 without one)."""
    return dist.get_world_size() if _distributed_ready() else 1


def _elastic_attempt_store(env: ClusterEnvironment, rank: int, world: int,
                           timeout: Optional[datetime.timedelta]) -> Optional[Any]:  # fmt: skip
    """Under torchrun, the agent's store with a prefix per restart attempt.

    The elastic agent keeps one store (and port) across restarts, so the keys the previous attempt's groups
    wrote are still there; a restarted rank could read a dead peer's address from them before the live peer
    overwrites it ("Gloo connectFullMesh failed ... Connection refused"). A prefix per attempt cannot collide."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if "TORCHELASTIC_RUN_ID" not in os.environ or attempt is None:
        return None
    from torch.distributed.rendezvous import _create_c10d_store

    store = _create_c10d_store(env.main_address, int(env.main_port), rank, world, timeout or dist.default_pg_timeout)
    return dist.PrefixStore(f"/trainer/attempt_{attempt}", store)


_MONITOR: dict[str, Any] = {}  # the monitoring group of this process's default process group (and which one)


class ParallelStrategy(WholeFolderLoading, Strategy):
    """One process per device, on one or several nodes; a base for DDP and sharded strategies.

    ``start_method``: ``"popen"`` re-runs the script for the other ranks (``"ddp"``); ``"spawn"``,
    ``"fork"``, ``"forkserver"`` start them with ``torch.multiprocessing`` for each stage (``"ddp_spawn"``).
    Under torchrun or SLURM nothing is launched: the strategy joins the job.

    ``timeout`` is the process-group timeout while the job starts (torch's default when None); after the first
    optimizer step it becomes ``train_timeout`` (default 300 s; None keeps ``timeout``), so a rank that stops
    answering ends the job within minutes, with a message naming it (:mod:`trainer.strategies.launch.hang_report`).
    """

    is_distributed = True
    # Shared by every Trainer in the process (they share one process group): did the latest stage end cleanly?
    _last_stage_clean = False

    def __init__(
        self,
        cluster_environment: Optional[ClusterEnvironment] = None,
        process_group_backend: Optional[str] = None,
        timeout: Union[None, float, datetime.timedelta] = None,
        start_method: str = "popen",
        precision: Optional[Precision] = None,
        train_timeout: Union[None, float, datetime.timedelta] = hang_report.DEFAULT_TRAIN_TIMEOUT_S,
    ) -> None:
        super().__init__(precision=precision)
        if start_method not in START_METHODS:
            raise ConfigurationError(f"start_method={start_method!r} is not known. Valid values: {', '.join(START_METHODS)}.")
        if process_group_backend is not None and process_group_backend not in ("gloo", "nccl", "mpi", "ucc", "xccl"):
            raise ConfigurationError(
                f"process_group_backend={process_group_backend!r} is not known. Use 'gloo' (CPU) or 'nccl' (CUDA), "
                "or None to choose by device."
            )
        self.cluster_environment = cluster_environment
        self.process_group_backend = process_group_backend
        self.timeout = _as_timedelta(timeout)
        self.train_timeout = _as_timedelta(train_timeout)
        self.start_method = start_method
        self.parallel_devices: list[torch.device] = [self._root_device]
        self.num_nodes = 1
        self._ranks: Optional[tuple[int, int, int, int]] = None  # (world size, global, local, node) once set up
        self._owns_process_group = False
        self._monitor_group: Any = None  # gloo group of the monitored barriers (trainer.strategies.launch.hang_report)

    def connect(self, devices: list[torch.device], num_nodes: int, precision: Optional[Precision]) -> None:
        super().connect(devices, num_nodes, precision)
        kind = devices[0].type if devices else "cpu"
        if kind == "mps":
            raise ConfigurationError(
                f"strategy={self.strategy_name!r} needs CPU processes (gloo) or CUDA GPUs (nccl); MPS runs one "
                "device only. Use accelerator='cpu' with devices=N, or devices=1 on MPS."
            )
        if self.process_group_backend == "nccl" and kind != "cuda":
            raise ConfigurationError(
                "process_group_backend='nccl' needs CUDA GPUs but the devices resolved to the CPU. Use 'gloo' (or None)."
            )
        self.parallel_devices = list(devices)
        self.num_nodes = num_nodes
        env = self.cluster_environment or detect_environment() or LocalEnvironment()
        env.validate(len(devices), num_nodes)
        self.cluster_environment = env
        self.launcher = None
        if not env.creates_processes_externally:
            from trainer.strategies.launch.launchers import SpawnLauncher, SubprocessScriptLauncher

            if self.start_method == "popen":
                self.launcher = SubprocessScriptLauncher(env, len(devices))
            else:
                self.launcher = SpawnLauncher(env, len(devices), self.start_method)

    # ------------------------------------------------------------------ topology
    def _topology(self) -> tuple[int, int, int, int]:
        if self._ranks is not None:
            return self._ranks
        env = self.cluster_environment
        if env is None:
            return (1, 0, 0, 0)
        return (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank())

    @property
    def world_size(self) -> int:
        return self._topology()[0]

    @property
    def global_rank(self) -> int:
        return self._topology()[1]

    @property
    def local_rank(self) -> int:
        return self._topology()[2]

    @property
    def node_rank(self) -> int:
        return self._topology()[3]

    @property
    def distributed_sampler_kwargs(self) -> Optional[dict[str, int]]:
        world, rank = self._topology()[:2]
        return {"num_replicas": world, "rank": rank}

    @property
    def process_group_backend_name(self) -> str:
        """The backend in use: the one given, else nccl on CUDA and gloo on the CPU."""
        if self.process_group_backend is not None:
            return self.process_group_backend
        return "nccl" if self.root_device.type == "cuda" else "gloo"

    def _init_device(self) -> torch.device:
        # Trainer.init_module() may run before setup_environment picked this rank's device.
        local_rank = self.local_rank
        return self.parallel_devices[local_rank] if local_rank < len(self.parallel_devices) else self.root_device

    def setup_environment(self) -> None:
        """Read this process's ranks, pick its device, join (or create) the process group."""
        env = self.cluster_environment
        if env is None:
            raise RuntimeError(f"{type(self).__name__}.setup_environment() called before connect().")
        ParallelStrategy._last_stage_clean = False
        self._ranks = (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank())
        local_rank = self._ranks[2]
        if local_rank >= len(self.parallel_devices):
            raise ConfigurationError(
                f"This process has LOCAL_RANK={local_rank} but only {len(self.parallel_devices)} device(s) per node are "
                "configured. Set devices to the number of processes per node."
            )
        self._root_device = self.parallel_devices[local_rank]
        if self._root_device.type == "cuda":
            torch.cuda.set_device(self._root_device)
        rank_zero_only.rank = self._ranks[1]
        self._init_process_group(env)
        self._start_monitoring()
        super().setup_environment()

    def _init_process_group(self, env: ClusterEnvironment) -> None:
        if not dist.is_available():
            raise ConfigurationError("This PyTorch build has no torch.distributed support; use devices=1.")
        world, rank = self._ranks[:2]
        if dist.is_initialized():
            if dist.get_world_size() != world or dist.get_rank() != rank:
                raise ConfigurationError(
                    f"A process group of world size {dist.get_world_size()} (rank {dist.get_rank()}) already exists, "
                    f"but this Trainer expects world size {world} (rank {rank})."
                )
            return
        os.environ["MASTER_ADDR"] = env.main_address
        os.environ["MASTER_PORT"] = str(env.main_port)
        if self.process_group_backend_name == "nccl":
            hang_report.flight_recorder_env()  # read when the NCCL backend is created
        options: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        store = _elastic_attempt_store(env, rank, world, self.timeout)
        if store is not None:
            options["store"] = store
        dist.init_process_group(self.process_group_backend_name, rank=rank, world_size=world, **options)
        self._owns_process_group = True
        atexit.register(self._destroy_process_group)

    def _start_monitoring(self) -> None:
        """Create (once per process group) the gloo group of the monitored barriers, and meet there."""
        if world_size_of_job() < 2:
            return
        default = dist.distributed_c10d._get_default_group()
        if _MONITOR.get("for") is not default:
            _MONITOR.update({"for": default, "group": hang_report.create_monitor_group(self.timeout)})
        self._monitor_group = _MONITOR["group"]
        self.barrier("start-up")

    @property
    def barrier_timeout(self) -> datetime.timedelta:
        """How long a barrier waits for every rank: the start-up timeout (a barrier may wait for rank 0's I/O)."""
        return self.timeout or dist.default_pg_timeout

    def after_first_step(self) -> None:
        """The job runs: shorten the process-group timeout to ``train_timeout`` (only a group this strategy made)."""
        if self._owns_process_group and self.train_timeout is not None and _distributed_ready():
            current = self.timeout or dist.default_pg_timeout
            if self.train_timeout < current:
                dist.distributed_c10d._set_pg_timeout(self.train_timeout)

    def unresponsive_ranks(self) -> Optional[list[int]]:
        """After a collective timed out: the ranks that do not answer a monitored barrier (see
        :func:`trainer.strategies.launch.hang_report.unresponsive_ranks`); ``None`` when that cannot be told."""
        if self._monitor_group is None or not _distributed_ready():
            return None
        wait = min(self.train_timeout or self.barrier_timeout, datetime.timedelta(seconds=30))
        return hang_report.unresponsive_ranks(self._monitor_group, wait)

    # ------------------------------------------------------------------ collectives
    def barrier(self, name: Optional[str] = None) -> None:
        """Wait for every rank; one that does not arrive within :attr:`barrier_timeout` is named (``HangError``)."""
        if not _distributed_ready():
            return
        if self._monitor_group is not None:
            hang_report.monitored_barrier(self._monitor_group, name or "barrier", self.barrier_timeout)
            return
        if self.process_group_backend_name == "nccl":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not _distributed_ready():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather(self, tensor: Tensor) -> Tensor:
        """Every rank's ``tensor`` (same shape on every rank), stacked along a new first dimension."""
        if not _distributed_ready():
            return tensor.unsqueeze(0)
        local = tensor.detach().to(self.root_device).contiguous()
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local)
        return torch.stack(gathered).to(tensor.device)

    def reduce(self, tensor: Tensor, op: str = "mean") -> Tensor:
        """A new tensor holding ``tensor`` reduced over ranks; the argument is left unchanged."""
        if op not in _REDUCE_OPS:
            raise ConfigurationError(f"reduce(op={op!r}) is not supported. Use 'mean', 'sum', 'max' or 'min'.")
        if not _distributed_ready():
            return tensor
        result = tensor.detach().to(self.root_device, copy=True)
        if op == "mean" and not result.is_floating_point():
            result = result.to(torch.get_default_dtype())
        dist.all_reduce(result, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]))
        if op == "mean":
            result /= self.world_size
        return result.to(tensor.device)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if not _distributed_ready():
            return decision
        votes = torch.tensor(int(bool(decision)), device=self.root_device)
        dist.all_reduce(votes, op=dist.ReduceOp.SUM)
        count = int(votes.item())
        return count == self.world_size if all else count > 0

    def teardown(self) -> None:
        """Drop the wrapper after a stage. The process group stays for this process's next stage (creating a
        new one on the same port would race with ranks still leaving the old one); it is destroyed at exit."""
        self.model = self.module
        ParallelStrategy._last_stage_clean = True

    def _destroy_process_group(self) -> None:
        """At exit: meet the other ranks if nothing failed, then destroy the group while Python is still alive.

        A gloo group left to interpreter finalization can abort the process ("terminate called without an
        active exception", pytorch#190489): its worker threads still hold tensors when the interpreter goes.
        So it is destroyed whenever this process owns it, also in scripts (the Engine's) whose last stage
        never reached ``teardown``, and so is every object still holding it. Only the barrier depends on a
        clean end: after a failure a peer may be gone and meeting it could block. An NCCL group after a
        failure is left to the launcher, as destroying communicators with a peer gone can block too.
        """
        if not (self._owns_process_group and _distributed_ready()):
            self._owns_process_group = False
            return
        self._owns_process_group = False
        # Wrappers that hold the group (a DDP reducer) can outlive their stage in reference cycles; collected
        # only at interpreter finalization, they would destroy the gloo group there and abort the same way.
        gc.collect()
        ended_cleanly = ParallelStrategy._last_stage_clean and getattr(sys, "last_value", None) is None
        if ended_cleanly:
            # Meet first: a rank that closes its connections while a peer is still finishing the last
            # collective can make that peer's exit abort.
            try:
                self.barrier("exit")
            except Exception:  # a peer already left; destroying locally is still right
                pass
        elif self.process_group_backend_name == "nccl":
            return
        dist.destroy_process_group()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(strategy={self.strategy_name!r}, devices={len(self.parallel_devices)}, "
            f"num_nodes={self.num_nodes}, environment={type(self.cluster_environment).__name__}, "
            f"precision={self.precision.name!r})"
        )
