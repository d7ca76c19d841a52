"""Replica groups on torchft: the part ``ft_ddp`` and ``ft_hsdp`` share (see :mod:`.fault_tolerant`).

A job is ``N`` replica groups; each group is an ordinary job of its own (one or more ranks, its own process group,
launched by torchrun, SLURM or the ``trainer run --replica-groups`` launcher) that knows its replica id and the
lighthouse (``REPLICA_GROUP_ID``, ``TORCHFT_LIGHTHOUSE``, ``NUM_REPLICA_GROUPS``, or the strategy's arguments). Every
optimizer step starts with a quorum of the live groups (torchft's ``Manager`` asks the lighthouse); the gradient is
averaged over the groups of that quorum, and the step is taken only when the whole quorum agrees
(``should_commit``): a group that died mid-step makes the survivors skip that one step, not stop.

Healing: a group (re)starts, joins the quorum before its first step and, when it is behind, receives a live peer's
whole training state (weights, optimizer, schedulers, loop and data position) over the network: the Trainer's
in-memory checkpoint, never a file. torchft is imported only when one of these strategies sets up.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import log

REPLICA_ID_ENV = "REPLICA_GROUP_ID"
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
NUM_GROUPS_ENV = "NUM_REPLICA_GROUPS"
MODES = ("sync", "local_sgd", "diloco")
_SHARD = "__ft_local_shard__"  # marks a DTensor sent as its local shard (see ReplicaGroupMember._to_wire)


def _env_int(name: str, given: Optional[int], what: str) -> int:
    if given is not None:
        value: Any = given
    else:
        raw = os.environ.get(name)
        if raw is None:
            raise ConfigurationError(
                f"A fault-tolerant strategy needs {what}: pass it to FaultTolerantStrategy(...) or set {name} "
                "(`trainer run --replica-groups N` sets it for every group)."
            )
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r} must be a whole number ({what}).") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{what} = {value!r} must be a whole number >= 0.")
    return value


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when there is none)."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = batch_size_of(item)
            if size:
                return size
    return 0


class ReplicaGroupMember:
    """Mixin for a :class:`~trainer.strategies.parallel.ParallelStrategy`: this process's group takes part in a
    torchft quorum of replica groups. The subclass reduces gradients across groups through :attr:`manager`.

    Args:
        min_replicas: groups a step needs to commit (default 1: a lone survivor carries on).
        lighthouse: ``host:port`` of the lighthouse (default ``$TORCHFT_LIGHTHOUSE``).
        replica_id: this group's id, 0..N-1 (default ``$REPLICA_GROUP_ID``).
        num_replica_groups: how many groups the job has at most: the data is split in that many shards per group
            rank (default ``$NUM_REPLICA_GROUPS``).
        ft_timeout: seconds a cross-group collective or a recovery transfer may take before the step is dropped.
        quorum_timeout: seconds to wait for a quorum.
        connect_timeout: seconds to reach the lighthouse and the peers' managers.
        mode: ``"sync"`` (gradients averaged every step), ``"local_sgd"`` or ``"diloco"`` (each group steps alone and
            the weights are synchronised every ``sync_every`` steps: for slow links between groups).
        sync_every: steps between synchronisations in the semi-synchronous modes.
        outer_lr: DiLoCo's outer SGD (Nesterov, momentum 0.9) learning rate.
    """

    def _init_replicas(self, min_replicas: int = 1, lighthouse: Optional[str] = None, replica_id: Optional[int] = None,
                       num_replica_groups: Optional[int] = None, ft_timeout: float = 30.0,
                       quorum_timeout: float = 120.0, connect_timeout: float = 30.0, mode: str = "sync",
                       sync_every: int = 20, outer_lr: float = 0.7) -> None:  # fmt: skip
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 1:
            raise ConfigurationError(f"min_replicas={min_replicas!r} must be a whole number >= 1.")
        if mode not in MODES:
            raise ConfigurationError(f"mode={mode!r} is not known. Valid values: {', '.join(map(repr, MODES))}.")
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ConfigurationError(f"sync_every={sync_every!r} must be a whole number >= 1.")
        for name, value in (("ft_timeout", ft_timeout), ("quorum_timeout", quorum_timeout),
                            ("connect_timeout", connect_timeout)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds.")
        self.min_replicas = min_replicas
        self._lighthouse = lighthouse
        self._replica_id = replica_id
        self._num_groups = num_replica_groups
        self.ft_timeout = datetime.timedelta(seconds=ft_timeout)
        self.quorum_timeout = datetime.timedelta(seconds=quorum_timeout)
        self.connect_timeout = datetime.timedelta(seconds=connect_timeout)
        self.mode = mode
        self.sync_every = sync_every
        self.outer_lr = outer_lr
        self.manager: Any = None
        #: True while a training state is read for, or loaded from, a peer group (see ``_peer_state``).
        self.for_peer = False
        self._state_fns: Any = None  # (state, load) of the running fit, given by join_replicas
        self._registered = False
        self._healed = False
        self._in_step = False  # a quorum was formed for the step now running
        self._replicas = 0  # groups in the last quorum
        self._quorum_start = 0.0
        self._stall = 0.0  # seconds lost since the last committed step (failed steps, waiting for quorum)
        self._last_batch: Any = None
        self._semi_sync: Any = None  # torchft's LocalSGD / DiLoCo context, entered in setup_optimizers
        #: What the metrics callback logs: ``ft/replicas``, ``ft/stall_s``, ``ft/samples_skipped``, ``ft/failed_steps``.
        self.replica_metrics: dict[str, float] = {"ft/replicas": 0.0, "ft/stall_s": 0.0, "ft/samples_skipped": 0.0,
                                                  "ft/failed_steps": 0.0}  # fmt: skip

    # ------------------------------------------------------------------ who we are
    @property
    def replica_id(self) -> int:
        """This group's replica id (``REPLICA_GROUP_ID``)."""
        if self._replica_id is None:
            self._replica_id = _env_int(REPLICA_ID_ENV, None, "this replica group's id (0..N-1)")
        return self._replica_id

    @property
    def num_replica_groups(self) -> int:
        """The number of replica groups the data is split for (``NUM_REPLICA_GROUPS``)."""
        if self._num_groups is None:
            self._num_groups = _env_int(NUM_GROUPS_ENV, None, "the number of replica groups")
        if self._num_groups < 1:
            raise ConfigurationError(f"num_replica_groups={self._num_groups} must be at least 1.")
        if self.replica_id >= self._num_groups:
            raise ConfigurationError(
                f"replica id {self.replica_id} is not below the number of replica groups ({self._num_groups}): "
                f"ids run 0..{self._num_groups - 1}."
            )
        return self._num_groups

    @property
    def lighthouse(self) -> str:
        """The lighthouse address the group's manager reports to."""
        address = self._lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not address:
            raise ConfigurationError(
                f"A fault-tolerant strategy needs the lighthouse's address: pass lighthouse='http://host:29510' or "
                f"set {LIGHTHOUSE_ENV} (start one with `trainer lighthouse --min-replicas 1`)."
            )
        return address if "://" in address else f"http://{address}"

    @property
    def distributed_sampler_kwargs(self) -> Optional[dict[str, int]]:
        """Each group reads its own shard: ``group world × groups`` shards, this rank's is
        ``replica_id × group world + group rank`` (torchft's and torchtitan's split)."""
        world, rank = self._topology()[:2]  # type: ignore[attr-defined]
        return {"num_replicas": world * self.num_replica_groups, "rank": self.replica_id * world + rank}

    # ------------------------------------------------------------------ the manager
    def _start_manager(self) -> None:
        """Create torchft's manager for this group (after the group's own process group exists)."""
        try:
            import torchft
        except ImportError as err:
            raise ConfigurationError(
                f"strategy={self.strategy_name!r} needs torchft: `pip install torchft-nightly` (or the 'ft' extra)."  # type: ignore[attr-defined]
            ) from err
        self.num_replica_groups  # checks the id against the count now, not at the first batch
        if self.root_device.type == "cuda":  # type: ignore[attr-defined]
            pg: Any = torchft.ProcessGroupNCCL(timeout=self.ft_timeout)
        else:
            pg = torchft.ProcessGroupGloo(timeout=self.ft_timeout)
        env = self.cluster_environment  # type: ignore[attr-defined]
        world, rank = self._topology()[:2]  # type: ignore[attr-defined]
        self.manager = torchft.Manager(
            pg=pg, load_state_dict=None, state_dict=None, min_replica_size=self.min_replicas,
            use_async_quorum=False, timeout=self.ft_timeout, quorum_timeout=self.quorum_timeout,
            connect_timeout=self.connect_timeout, rank=rank, world_size=world, store_addr=env.main_address,
            store_port=int(env.main_port), lighthouse_addr=self.lighthouse, replica_id=str(self.replica_id),
        )  # fmt: skip

    def join_replicas(self, state: Callable[[], dict[str, Any]], load: Callable[[dict[str, Any]], None],
                      global_step: int) -> None:  # fmt: skip
        """Before the first training step: join the quorum; a group behind its peers loads a live peer's training
        state (``load(state())`` of that peer) instead of reading a checkpoint."""
        manager = self.manager
        if manager is None:
            return

        self._state_fns = (state, load)  # the running fit's (a later fit in this process replaces them)
        self._healed = False
        if not self._registered:  # torchft refuses a second registration under one key
            manager.register_state_dict_fn("trainer", self._receive, self._send)
            self._registered = True
        # The manager counts committed quorum steps: every step when synchronous, every sync_every steps otherwise.
        step = global_step if self.mode == "sync" else global_step // self.sync_every
        manager.load_state_dict({"step": step, "batches_committed": manager.batches_committed()})
        if self.mode == "sync":
            self._begin_step()
        elif self.mode == "local_sgd" and self._semi_sync is not None:
            self._semi_sync.sync()  # the live groups meet at their next synchronisation; this one heals there
            self._replicas = manager.num_participants()
        if self.mode == "diloco":
            log.info("ft: replica group %d joined at step %d; the groups meet at the next synchronisation",
                     self.replica_id, global_step)  # fmt: skip
            return
        at = f"{'step' if self.mode == 'sync' else 'synchronisation'} {manager.current_step()}"
        log.info("ft: replica group %d joined at %s with %d group(s)%s", self.replica_id, at, self._replicas,
                 f" (healed from a peer at {at})" if self._healed else "")  # fmt: skip

    def _send(self) -> Any:
        """The training state a healing peer receives (torchft calls it in its quorum thread)."""
        with self._peer_state():
            return self._to_wire(self._state_fns[0]())

    def _receive(self, sent: Any) -> None:
        """Load a live peer's training state (torchft calls it when this group heals)."""
        with self._peer_state():
            self._state_fns[1](self._from_wire(sent))
        self._healed = True

    @contextlib.contextmanager
    def _peer_state(self) -> Iterator[None]:
        """While a state goes to or comes from a peer: state dicts are this rank's own (``for_peer`` is True), read
        and loaded without collectives. torchft pairs ranks by group rank, and at the first step a group's ranks
        may heal from different groups (each rank from its own source), so a group never meets as a whole here."""
        self.for_peer = True
        try:
            yield
        finally:
            self.for_peer = False

    def _to_wire(self, obj: Any) -> Any:
        """A training state as it travels to a healing peer: each sharded tensor (``DTensor``) as this rank's local
        shard (the peer's same rank holds the same slice), since a device mesh does not cross processes."""
        from torch.distributed.tensor import DTensor

        if isinstance(obj, DTensor):
            return {_SHARD: obj.to_local(), "shape": tuple(obj.shape), "stride": tuple(obj.stride()),
                    "placements": tuple(obj.placements)}  # fmt: skip
        if isinstance(obj, dict):
            return {key: self._to_wire(value) for key, value in obj.items()}
        if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
            return type(obj)(self._to_wire(value) for value in obj)
        return obj

    def _from_wire(self, obj: Any) -> Any:
        """The inverse of :meth:`_to_wire`: local shards become ``DTensor`` s on this group's mesh again."""
        if isinstance(obj, dict):
            if _SHARD in obj:
                from torch.distributed.tensor import DTensor

                local = obj[_SHARD].to(self.root_device)  # type: ignore[attr-defined]
                return DTensor.from_local(local, self.device_mesh, obj["placements"], shape=torch.Size(obj["shape"]),  # type: ignore[attr-defined]
                                          stride=obj["stride"], run_check=False)  # fmt: skip
            return {key: self._from_wire(value) for key, value in obj.items()}
        if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
            return type(obj)(self._from_wire(value) for value in obj)
        return obj

    def _begin_step(self) -> None:
        """Form this step's quorum (and heal, when this group is behind)."""
        self._in_step = True
        self._quorum_start = start = time.monotonic()
        try:
            self.manager.start_quorum(timeout=self.quorum_timeout)
        except Exception as err:
            raise RuntimeError(
                f"ft: replica group {self.replica_id} could not form a quorum through the lighthouse at "
                f"{self.lighthouse} within {self.quorum_timeout.total_seconds():.0f} s ({err}). Is it running "
                "(`trainer lighthouse --min-replicas N`) and reachable from here?"
            ) from err
        replicas = self.manager.num_participants()
        if replicas != self._replicas:
            stall = self._stall + time.monotonic() - start
            if self._replicas:  # not the first quorum
                change = "left" if replicas < self._replicas else "joined"
                log.info("ft: replica group %d: %d group(s) %s at step %d, now %d; the step stalled %.1f s",
                         self.replica_id, abs(replicas - self._replicas), change, self.manager.current_step(),
                         replicas, stall)  # fmt: skip
            self.replica_metrics["ft/stall_s"] = stall
            self._replicas = replicas
            self.replica_metrics["ft/replicas"] = float(replicas)

    def _commit(self) -> bool:
        """Whether this step's update is taken (the whole quorum succeeded); counts what a failed step loses."""
        self._in_step = False
        committed = bool(self.manager.should_commit(timeout=self.ft_timeout))
        metrics = self.replica_metrics
        world = self._topology()[0]  # type: ignore[attr-defined]
        if self._replicas < self.num_replica_groups or not committed:
            per_group = batch_size_of(self._last_batch) * world
            missing = self.num_replica_groups - (self._replicas if committed else 0)
            metrics["ft/samples_skipped"] += per_group * max(missing, 0)
        if committed:
            self._stall = 0.0
        else:
            metrics["ft/failed_steps"] += 1
            self._stall += time.monotonic() - self._quorum_start
            log.warning("ft: replica group %d: step %d did not commit (a peer failed during it); its update is "
                        "dropped and the next batch retries it", self.replica_id, self.manager.current_step())
        return committed

    @property
    def is_checkpoint_writer(self) -> bool:
        """True in the group that writes checkpoints: the live group with the lowest replica rank in the current
        quorum, so groups never overwrite each other (which of its ranks write is the strategy's usual rule)."""
        manager = self.manager
        return manager is None or self._replicas <= 1 or manager.participating_rank() in (0, None)

    def _shutdown_manager(self) -> None:
        if self._semi_sync is not None:
            self._semi_sync.__exit__(None, None, None)
            self._semi_sync = None
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None

    # ------------------------------------------------------------------ semi-synchronous modes
    def _enter_semi_sync(self, module: Any, optimizer: Any) -> None:
        """LocalSGD / DiLoCo: torchft's context hooks the optimizer; the weights are averaged every ``sync_every``."""
        from torchft import local_sgd

        if self._semi_sync is not None:
            self._semi_sync.__exit__(None, None, None)
        if self.mode == "local_sgd":
            self._semi_sync = local_sgd.LocalSGD(self.manager, module, optimizer, self.sync_every)
        else:
            params = [p for p in module.parameters() if p.requires_grad]
            outer = torch.optim.SGD(params, lr=self.outer_lr, momentum=0.9, nesterov=True)
            self._semi_sync = local_sgd.DiLoCo(self.manager, [module], optimizer, outer, self.sync_every)
        self._semi_sync.__enter__()
