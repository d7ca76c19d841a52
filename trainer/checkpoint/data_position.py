"""Where an epoch's training data stands, so a fit resumed mid-epoch continues at the very next batch.

A map-style ``DataLoader`` is positioned through its index sampler (the batch sampler, or the sampler when
``batch_size=None``), which this module stands in for while each epoch's iterator is created. At the epoch's first
index it records the random state (``RandomSampler`` without a generator seeds itself from the global torch RNG
there, and ``iter(DataLoader)`` draws its worker base seed from it as well; any ``torch.Generator`` the loader or
sampler holds too) and, for the samplers whose order is known, the order itself
(:mod:`trainer.data.epoch_order`). On resume a known order is entered at its position, and its rest dealt to the
ranks of the resumed run (another world size with the same global batch sees every sample once); another sampler
is re-drawn from the saved state and its finished index batches dropped. No sample is loaded for them either way.
With ``num_workers > 0`` the index batches carry the epoch's seed, and the dataset is read through
:class:`~trainer.data.sample_seeds.SeededDataset`: each sample's random draws depend only on (run seed, epoch,
index), so random augmentation resumes exactly with any number of workers.

A loader that keeps its own position (``state_dict()``/``load_state_dict()``: torchdata's ``StatefulDataLoader``
and the like) is saved per rank through that state and restored from it. An ``IterableDataset`` with its own
``state_dict()`` (``datasets.IterableDataset``) loaded in this process continues from the state it had after the
finished batches (:mod:`trainer.checkpoint.dataset_state`), saved per rank too (``dataset_states``: each rank's
dataset may read its own shard, e.g. split by ``split_dataset_by_node``). Anything else (another ``IterableDataset``,
a plain iterable of batches) cannot be positioned: its iterator is rebuilt from the random state captured before the
epoch's ``iter()`` and the finished batches are read again and dropped, with a warning naming it.

A :class:`~trainer.data.combined_loader.CombinedLoader` is positioned loader by loader: each has its own position
(the random state of its current pass and how many batches that pass gave), so every loader, including one that
started over in ``max_size_cycle`` mode, continues at its exact batch.
"""
from __future__ import annotations

import contextlib
import itertools
import math
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer.strategies.rank import rank_zero_warn
from trainer.checkpoint.dataset_state import DatasetState
from trainer.data.combined_loader import CombinedIterator, CombinedLoader
from trainer.data.loaders import loader_length
from trainer.data.epoch_order import order_record, positionable, rest_of_epoch
from trainer.data.sample_seeds import SampleKey, SampleKeys, SeededDataset, epoch_seed
from trainer.reproducibility.seed import capture_rng_state, restore_rng_state


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` once on every sampler, batch sampler and dataset of ``loader`` that has it."""
    seen: set[int] = set()
    batch_sampler = getattr(loader, "batch_sampler", None)
    for obj in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None),
                getattr(loader, "dataset", None)):  # fmt: skip
        if obj is not None and id(obj) not in seen and callable(getattr(obj, "set_epoch", None)):
            seen.add(id(obj))
            obj.set_epoch(epoch)


def _replicas(loader: Any) -> int:
    """How many processes share the loader's data (a DistributedSampler's ``num_replicas``), else 1."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for obj in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        replicas = getattr(obj, "num_replicas", None)
        if isinstance(replicas, int):
            return replicas
    return 1


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The ``torch.Generator`` objects a DataLoader, its sampler or batch sampler hold (each once)."""
    found: dict[int, torch.Generator] = {}
    batch_sampler = getattr(loader, "batch_sampler", None)
    for obj in (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        generator = getattr(obj, "generator", None)
        if isinstance(generator, torch.Generator):
            found.setdefault(id(generator), generator)
    return list(found.values())


def _capture(generators: list[torch.Generator]) -> dict[str, Any]:
    return {"rng": capture_rng_state(cuda=False), "generators": [g.get_state() for g in generators]}


def _restore(state: dict[str, Any], generators: list[torch.Generator]) -> None:
    restore_rng_state(state["rng"])
    saved = state.get("generators", [])
    if len(saved) != len(generators):
        rank_zero_warn(
            f"The training dataloader now has {len(generators)} torch.Generator(s) but the checkpoint recorded "
            f"{len(saved)}; the resumed epoch's shuffle order may differ from the interrupted one."
        )
    for generator, generator_state in zip(generators, saved):
        generator.set_state(generator_state)


_NOW = "now"  # a positioned epoch whose order is recorded when it is drawn
_NO_POSITION = "has no sampler to position and no state_dict() (an IterableDataset or a custom iterable)"


def _has_own_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _own_state_holder(loader: Any) -> Any:
    """What positions ``loader`` through its own ``state_dict()``/``load_state_dict()``: the loader itself (torchdata's
    StatefulDataLoader, litdata's StreamingDataLoader, a Grain iterator, any such iterable); ``None`` when it keeps
    none. A DataLoader's workers hold their own copies of a stateful dataset, so its state is not this process's:
    that warns (it needs a stateful loader)."""
    if _has_own_state(loader) and not isinstance(loader, CombinedLoader):
        return loader
    if (isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset)
            and _has_own_state(loader.dataset) and loader.num_workers > 0):  # fmt: skip
        # (read in this process, such a dataset is positioned by trainer.checkpoint.dataset_state)
        rank_zero_warn(
            f"{_name(loader)} has state_dict() but is read by {loader.num_workers} worker processes, whose copies "
            "hold the position: a mid-epoch resume cannot restore it. Use torchdata's StatefulDataLoader (it "
            "gathers the workers' states) or num_workers=0."
        )
    return None


def _name(loader: Any) -> str:
    """The loader's class name, and its dataset's for a DataLoader (the name a user recognises)."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(loader, DataLoader) and dataset is not None:
        return f"{type(dataset).__name__} (in a {type(loader).__name__})"
    return type(loader).__name__


def _index_attribute(loader: Any) -> Optional[str]:
    """The DataLoader attribute that yields this loader's indices, or ``None`` when it cannot be positioned."""
    if (not isinstance(loader, DataLoader) or type(loader).__iter__ is not DataLoader.__iter__
            or isinstance(loader.dataset, IterableDataset)):  # fmt: skip
        return None
    return "batch_sampler" if loader.batch_sampler is not None else "sampler"


class _IndexSampler:
    """Stands in for a DataLoader's index sampler: records the random state and the order at each epoch's first
    index and, when armed, starts the next epoch ``skip`` index batches in. With per-sample seeds on
    (``seed_base``), its index batches carry the epoch's seed to the dataset (see :mod:`trainer.data.sample_seeds`)."""

    def __init__(self, inner: Any, generators: list[torch.Generator], batched: bool) -> None:
        self.inner = inner
        self.generators = generators
        self.batched = batched
        self.start_state: Optional[dict[str, Any]] = None
        self.order: Optional[dict[str, Any]] = None
        self.armed: Optional[tuple[int, Optional[dict[str, Any]], Any, int]] = None
        self.positioned: Optional[_PositionedIndices] = None
        self.seed_base: Optional[int] = None
        self.seeded: Any = None  # the SeededDataset the loader reads through, when seeding per sample

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # A DataLoader iterator may call this more than once while it is created (the multi-worker one does,
        # and uses the last): the arming lasts until the caller disarms it, and nothing is drawn until used.
        if self.armed is None:
            self.positioned = None
            # chain pulls _epoch() once, at the first index, then iterates the sampler itself: nothing per batch.
            indices: Iterator[Any] = itertools.chain.from_iterable(self._epoch())
        else:
            self.positioned = indices = _PositionedIndices(self, *self.armed)
        base = self.seed_base
        if base is None:
            return indices
        if self.batched:
            return map(SampleKeys, indices, itertools.repeat(base))
        return map(SampleKey, indices, itertools.repeat(base))

    def _epoch(self) -> Iterator[Any]:
        self.start_state = _capture(self.generators)  # runs at the first index: where the sampler draws its seed
        self.order = order_record(self.inner)
        yield self.inner


class _PositionedIndices:
    """The index batches of a resumed epoch: entered at its position from the saved order where the sampler's order
    is known (nothing drawn for the finished batches), else the sampler restarts from the saved state and drops
    ``skip``."""

    def __init__(self, owner: _IndexSampler, skip: int, state: Optional[dict[str, Any]], order: Any,
                 consumed: int) -> None:  # fmt: skip
        self.owner = owner
        self.skip = skip
        self.state = state
        self.order = order
        self.consumed = consumed
        self.iterator: Optional[Iterator[Any]] = None

    def prime(self) -> None:
        """Position the sampler now (before the training RNG is put back)."""
        if self.iterator is not None:
            return
        owner = self.owner
        if self.state is not None:
            _restore(self.state, owner.generators)
            owner.start_state = self.state
        else:  # skipping into a fresh epoch (skip_first_batches): the order is the one drawn now
            owner.start_state = _capture(owner.generators)
        order = order_record(owner.inner) if self.order == _NOW else self.order
        if order is not None and positionable(owner.inner):
            owner.order = order
            self.iterator = rest_of_epoch(order, self.consumed, owner.inner)
            return
        owner.order = order_record(owner.inner)
        iterator = iter(owner.inner)
        next(itertools.islice(iterator, self.skip - 1, self.skip), None)
        self.iterator = iterator

    def __iter__(self) -> "_PositionedIndices":
        return self

    def __next__(self) -> Any:
        if self.iterator is None:
            self.prime()
        return next(self.iterator)


@contextlib.contextmanager
def _standing_in(loader: DataLoader, attribute: str, sampler: _IndexSampler) -> Iterator[None]:
    # DataLoader forbids setting its samplers after construction; the swap lasts only while the epoch's
    # iterator is created (which keeps its own reference), so the user's loader is left as it was.
    original, dataset = getattr(loader, attribute), loader.dataset
    object.__setattr__(loader, attribute, sampler)
    if sampler.seed_base is not None:
        object.__setattr__(loader, "dataset", sampler.seeded)
    try:
        yield
    finally:
        object.__setattr__(loader, attribute, original)
        object.__setattr__(loader, "dataset", dataset)


class TrainDataPosition:
    """Creates each epoch's training iterator, positioned on resume; its state goes into checkpoints."""

    def __init__(self, sample_seeds: bool = True) -> None:
        #: Seed each sample's generators from (run seed, epoch, index) (see :mod:`trainer.data.sample_seeds`).
        self.sample_seeds = sample_seeds
        #: The run seed of per-sample seeds: the checkpoint's on resume, else ``torch.initial_seed()`` at first use.
        self.run_seed: Optional[int] = None
        self.epoch = 0
        self.replicas = 1
        self.batch_size: Optional[int] = None
        self._loader: Any = None
        self._sampler: Optional[_IndexSampler] = None
        self._replay_state: Optional[dict[str, Any]] = None
        self._warned_replay = False
        self._holder: Any = None  # the loader or dataset whose own state_dict() positions the epoch
        self._trail: Optional[_StateTrail] = None
        #: This process's rank and the number of ranks (per-rank states of stateful loaders).
        self.rank, self.world_size = 0, 1
        self._combined: Optional[_CombinedPosition] = None
        self._dataset_state: Optional[DatasetState] = None

    def iterator(self, loader: Any, epoch: int, skip: int = 0, saved: Optional[dict[str, Any]] = None) -> Iterator[Any]:
        """This epoch's iterator over ``loader``, after ``skip`` batches when resuming from ``saved``."""
        if isinstance(loader, CombinedLoader):
            if self._combined is None or self._combined.loader is not loader:
                self._combined = _CombinedPosition(loader)
            for child in self._combined.children:
                child.sample_seeds, child.run_seed = self.sample_seeds, self._run_seed()
            self.epoch = epoch
            return self._combined.iterator(epoch, skip, saved)
        self._combined = None
        set_sampler_epoch(loader, epoch)
        self.epoch = epoch
        self.replicas = _replicas(loader)
        start = saved.get("start") if saved is not None and saved.get("epoch") == epoch else None
        if skip and saved is not None and start is None:
            rank_zero_warn(
                "The checkpoint does not record the training sampler's state for this epoch; the resumed epoch "
                "continues at the same batch position, but a shuffled order may differ from the interrupted run."
            )
        self.batch_size = batch_size = getattr(loader, "batch_size", None)
        self._holder = self._trail = None
        attribute = _index_attribute(loader)
        sampler = self._index_sampler(loader, attribute) if attribute is not None else None
        order = saved.get("order") if start is not None else None
        dealt = skip and order is not None and sampler is not None and positionable(sampler.inner)
        resplit = saved is not None and saved.get("replicas", self.replicas) != self.replicas
        if resplit and batch_size is not None:  # 2 ranks × batch 4 resume as 4 ranks × batch 2: the same batches
            resplit = saved.get("replicas", 1) * (saved.get("batch_size") or 0) != self.replicas * batch_size
        elif resplit and dealt:  # the epoch's rest is dealt to the new ranks, but sample by sample
            resplit = saved.get("replicas", 1) * (saved.get("batch_size") or 1) != self.replicas
        if skip and resplit:
            rank_zero_warn(
                f"The checkpoint was saved mid-epoch with the data split {saved.get('replicas')} ways, now "
                f"{self.replicas}: until this epoch ends, some samples may be seen twice and others not at all. "
                "Keep the global batch (ranks × batch size) to resume exactly."
            )
        own = DatasetState.of(loader)  # a dataset that keeps its own position (datasets' IterableDataset)
        self._dataset_state = own
        why = ""
        if own is not None:
            mine, why = self._dataset_saved(saved if start is not None else None) if skip else (None, "")
            if not skip or own.can_resume(skip, mine):
                self._replay_state = _capture(loader_generators(loader))
                self._sampler = None
                return own.iterator(loader, skip, mine)
        if sampler is None:
            holder = _own_state_holder(loader) if own is None else None
            if holder is not None:
                return self._from_own_state(loader, holder, epoch, skip, saved, start)
            return self._replayed(loader, skip, start, why, own)
        # Only workers seed per sample: the main process draws from the training's stream, which checkpoints hold.
        workers = getattr(loader, "num_workers", 0) > 0
        sampler.seed_base = epoch_seed(self._run_seed(), epoch) if self.sample_seeds and workers else None
        if skip and saved is None:  # a fresh epoch entered ``skip`` batches in (skip_first_batches)
            sampler.armed = (skip, None, _NOW, skip * (batch_size or 1) * self.replicas)
        elif skip:
            consumed = skip * (saved.get("batch_size") or 1) * saved.get("replicas", 1) if dealt else 0
            sampler.armed = (skip, start if start is not None else _capture(sampler.generators),
                             order if dealt else None, consumed)  # fmt: skip
        with _standing_in(loader, attribute, sampler):
            iterator = iter(loader)
        sampler.armed = None
        if sampler.positioned is not None:
            sampler.positioned.prime()
        return iterator

    def _dataset_saved(self, saved: Optional[dict[str, Any]]) -> tuple[Optional[dict[str, Any]], str]:
        """This rank's saved dataset states (``dataset_states``: one entry per rank), or ``None`` and why not."""
        if saved is None:
            return None, "has state_dict() but the checkpoint recorded none for this epoch"
        states = saved.get("dataset_states")
        if states is None and saved.get("dataset") is not None:  # a checkpoint from before per-rank dataset states
            states = [saved["dataset"]]
        if states is None:
            return None, "has state_dict() but the checkpoint recorded none for this epoch"
        if len(states) != self.world_size:
            return None, (f"kept its state for {len(states)} rank(s), which cannot be dealt to {self.world_size} "
                          "(each rank's dataset holds its own shard)")  # fmt: skip
        return states[self.rank], ""

    def _index_sampler(self, loader: DataLoader, attribute: str) -> _IndexSampler:
        if self._loader is not loader or self._sampler is None:
            self._loader = loader
            self._sampler = _IndexSampler(getattr(loader, attribute), loader_generators(loader),
                                          attribute == "batch_sampler")  # fmt: skip
            self._sampler.seeded = SeededDataset(loader.dataset)
        return self._sampler

    def adopt(self, saved: Optional[dict[str, Any]]) -> None:
        """Take the run seed of per-sample seeds from a checkpoint's ``train_sampler`` (a resumed fit)."""
        if saved is not None and saved.get("run_seed") is not None:
            self.run_seed = int(saved["run_seed"])

    def _run_seed(self) -> int:
        if self.run_seed is None:
            self.run_seed = torch.initial_seed()
        return self.run_seed

    def _replayed(self, loader: Any, skip: int, start: Optional[dict[str, Any]], why: str = "",
                  own: Optional[DatasetState] = None) -> Iterator[Any]:  # fmt: skip
        self._sampler = None
        generators = loader_generators(loader)
        if skip and start is not None:
            _restore(start, generators)
        self._replay_state = _capture(generators)
        # a stateful dataset is tracked from the epoch's start, so the checkpoints after the replay hold its state
        iterator = own.iterator(loader, 0, None) if own is not None else iter(loader)
        if skip:
            if not self._warned_replay:
                self._warned_replay = True
                rank_zero_warn(
                    f"Resuming mid-epoch: {_name(loader)} {why or _NO_POSITION}, so the {skip} finished batches are "
                    "read again and dropped (exact only if it yields the same batches again). Give the dataset "
                    "state_dict()/load_state_dict(), use torchdata's StatefulDataLoader, or give it a length and use a "
                    "DataLoader with a sampler to skip them without loading."
                )
            next(itertools.islice(iterator, skip - 1, skip), None)
        return iterator

    def _from_own_state(self, loader: Any, holder: Any, epoch: int, skip: int,
                        saved: Optional[dict[str, Any]], start: Optional[dict[str, Any]]) -> Iterator[Any]:  # fmt: skip
        """A loader (or its dataset) that keeps its own position: restored from this rank's saved state."""
        self._holder = holder
        states = saved.get("loader_states") if saved is not None and saved.get("epoch") == epoch else None
        if skip and states is None:
            return self._replayed(loader, skip, start, "has state_dict() but the checkpoint recorded none for this epoch")
        if skip and len(states) != self.world_size:
            return self._replayed(loader, skip, start, f"kept one state per rank for {len(states)} rank(s), which "
                                  f"cannot be dealt to {self.world_size}")  # fmt: skip
        self._sampler = None
        if skip:
            holder.load_state_dict(states[self.rank])
        self._replay_state = _capture(loader_generators(loader))
        if loader_length(loader) != math.inf:
            return iter(loader)
        # Without a length the loop fetches one batch ahead (to know the last): keep the state from before it.
        self._trail = _StateTrail(iter(loader), holder, skip)
        return self._trail

    def state_dict(self, gather: Optional[Callable[[Any], list[Any]]] = None,
                   consumed: Optional[int] = None) -> dict[str, Any]:  # fmt: skip
        """The epoch, the random state its order was drawn from and the data split (plain values and tensors).
        A loader that keeps its own position adds every rank's state (``gather``: one value from each rank), as it
        stood after ``consumed`` batches of the epoch (the training's position, when known)."""
        if self._combined is not None:
            return self._combined.state_dict()
        sampler = self._sampler
        start = sampler.start_state if sampler is not None else self._replay_state
        order = sampler.order if sampler is not None else None
        state = {"epoch": self.epoch, "start": start, "replicas": self.replicas, "batch_size": self.batch_size,
                 "order": order, "run_seed": self.run_seed}  # fmt: skip
        if self._holder is not None:
            trail = self._trail
            own = trail.state(consumed) if trail is not None and trail.holder is self._holder else self._holder.state_dict()
            state["loader_states"] = gather(own) if gather is not None else self._this_rank_only(own)
        if self._dataset_state is not None:  # every rank's: each rank's dataset reads its own shard
            own_dataset = self._dataset_state.state_dict()
            state["dataset_states"] = (gather(own_dataset) if gather is not None
                                       else self._this_rank_only(own_dataset))  # fmt: skip
        return state

    def _this_rank_only(self, value: Any) -> list[Any]:
        # Not gathered (the same process continues its epoch): this rank's entry is the one it will read back.
        return [value if rank == self.rank else None for rank in range(self.world_size)]


class _StateTrail:
    """Iterates a loader that keeps its own state and has no length, remembering its state from before the batch
    last fetched: the loop fetches one batch ahead of the training, and a checkpoint must hold the training's
    position. One ``state_dict()`` call per batch, only for such loaders."""

    def __init__(self, iterator: Iterator[Any], holder: Any, start: int) -> None:
        self.iterator = iterator
        self.holder = holder
        self.fetched = start  # batches of the epoch fetched so far
        self.before_last: Any = None

    def __iter__(self) -> "_StateTrail":
        return self

    def __next__(self) -> Any:
        before = self.holder.state_dict()
        batch = next(self.iterator)
        self.before_last = before
        self.fetched += 1
        return batch

    def state(self, consumed: Optional[int]) -> Any:
        """The holder's state after ``consumed`` batches (it may have fetched one more)."""
        if consumed is not None and consumed == self.fetched - 1 and self.before_last is not None:
            return self.before_last
        return self.holder.state_dict()


class _CombinedPosition:
    """The position of every loader of a :class:`CombinedLoader` (one :class:`TrainDataPosition` each)."""

    def __init__(self, loader: CombinedLoader) -> None:
        self.loader = loader
        self.children = [TrainDataPosition() for _ in loader.flattened]
        self.epoch = 0
        self.running: Optional[CombinedIterator] = None

    def iterator(self, epoch: int, skip: int, saved: Optional[dict[str, Any]]) -> Iterator[Any]:
        self.epoch = epoch
        loaders = self.loader.flattened
        resume = saved.get("combined") if saved is not None and saved.get("epoch") == epoch else None
        if resume is not None and (resume.get("mode") != self.loader.mode or len(resume["consumed"]) != len(loaders)):
            rank_zero_warn(
                f"The checkpoint was saved with {len(resume['consumed'])} training loaders in mode "
                f"{resume.get('mode')!r}, now {len(loaders)} in mode {self.loader.mode!r}: the epoch restarts its loaders "
                "and skips the finished batches."
            )
            resume = None

        def start(i: int, child_skip: int, child_saved: Optional[dict[str, Any]]) -> Iterator[Any]:
            return self.children[i].iterator(loaders[i], epoch, child_skip, child_saved)

        if skip and resume is None:  # no per-loader record: start the loaders over and drop the finished batches
            self.running = self.loader.batches(start)
            next(itertools.islice(self.running, skip - 1, skip), None)
            return self.running
        self.running = self.loader.batches(start, resume)
        return self.running

    def state_dict(self) -> dict[str, Any]:
        combined = self.running.state_dict() if self.running is not None else None
        if combined is not None:
            combined["children"] = [child.state_dict() for child in self.children]
        return {"epoch": self.epoch, "combined": combined, "replicas": max(c.replicas for c in self.children),
                "run_seed": self.children[0].run_seed if self.children else None}
