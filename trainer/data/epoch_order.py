"""An epoch's sample order as a small record, so a resumed epoch is entered at its position in O(1) batches and
its rest can be dealt to another number of ranks.

The record is taken when the epoch's sampler starts (before it draws) for the samplers whose order is known:
``SequentialSampler``, ``RandomSampler`` (without replacement, one pass) and ``DistributedSampler``, read
directly or through a plain ``BatchSampler``. The order is the *global* one: a ``DistributedSampler``'s padded
order of every rank's samples, rank ``r`` taking positions ``r, r + W, ...``; after ``k`` batches of ``b``
samples on ``W`` ranks the first ``k * b * W`` positions were consumed. :func:`rest_of_epoch` regenerates that
order (one permutation, as the uninterrupted epoch drew it) and deals what was not consumed to this rank:
nothing is read, collated, or drawn and dropped for the finished batches.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator, Optional, Sequence

import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler


def _base_sampler(index_sampler: Any) -> Any:
    """The sampler under a plain ``BatchSampler``, or ``index_sampler`` itself."""
    return index_sampler.sampler if type(index_sampler) is BatchSampler else index_sampler


def order_record(index_sampler: Any) -> Optional[dict[str, Any]]:
    """The record of the order ``index_sampler`` is about to draw this epoch, or ``None`` when it is not known."""
    sampler = _base_sampler(index_sampler)
    kind = type(sampler)
    if kind is SequentialSampler:
        return {"kind": "sequential", "n": len(sampler.data_source)}
    if kind is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        generator = sampler.generator
        state = generator.get_state() if generator is not None else torch.get_rng_state()
        return {"kind": "random", "n": len(sampler.data_source), "state": state, "own": generator is not None}
    if kind is DistributedSampler:
        return {"kind": "distributed", "n": len(sampler.dataset), "shuffle": bool(sampler.shuffle),
                "seed": int(sampler.seed), "epoch": int(sampler.epoch), "replicas": int(sampler.num_replicas),
                "drop_last": bool(sampler.drop_last)}  # fmt: skip
    return None


def split_of(index_sampler: Any) -> tuple[int, int]:
    """(rank, number of ranks) the sampler deals the epoch to: a ``DistributedSampler``'s, else (0, 1)."""
    sampler = _base_sampler(index_sampler)
    if isinstance(sampler, DistributedSampler):
        return int(sampler.rank), int(sampler.num_replicas)
    return 0, 1


def positionable(index_sampler: Any) -> bool:
    """Whether :func:`rest_of_epoch` can deal to ``index_sampler`` (a known sampler, or a plain BatchSampler)."""
    return order_record(index_sampler) is not None


def _global_order(record: dict[str, Any], live: Optional[torch.Generator]) -> Sequence[int]:
    """The epoch's global order, drawn as the sampler drew it (``live``: the user's generator the sampler holds,
    advanced as the sampler advanced it; the global RNG, which a RandomSampler without a generator draws its seed
    from, is left where that draw leaves it)."""
    n = record["n"]
    kind = record["kind"]
    if kind == "sequential":
        return range(n)
    if kind == "random":
        if record["own"]:
            generator = live if live is not None else torch.Generator()
            generator.set_state(record["state"])
        else:  # RandomSampler seeds a fresh generator from the global RNG, put back to the record's state
            torch.set_rng_state(record["state"])
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        return torch.randperm(n, generator=generator).tolist()
    # DistributedSampler.__iter__, for all ranks at once
    if record["shuffle"]:
        generator = torch.Generator()
        generator.manual_seed(record["seed"] + record["epoch"])
        indices: list[int] = torch.randperm(n, generator=generator).tolist()
    else:
        indices = list(range(n))
    replicas = record["replicas"]
    if record["drop_last"]:
        return indices[: n // replicas * replicas]
    total = -(-n // replicas) * replicas
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    return indices


def rest_of_epoch(record: dict[str, Any], consumed: int, index_sampler: Any) -> Iterator[Any]:
    """The index batches (or indices) ``index_sampler`` gives for the rest of the epoch whose order is ``record``,
    after ``consumed`` samples of its global order: the rest dealt round-robin to this rank, padded by wrapping
    around (or cut, where the saved split dropped its tail) so every rank gets as many."""
    sampler = _base_sampler(index_sampler)
    live = sampler.generator if type(sampler) is RandomSampler and record["kind"] == "random" else None
    order = _global_order(record, live)
    rank, replicas = split_of(index_sampler)
    left = len(order) - consumed
    if left % replicas and not record.get("drop_last"):  # pad by wrapping around, as DistributedSampler pads
        rest = list(order[consumed:])
        rest += rest[: replicas - left % replicas]
        indices: Iterator[Any] = iter(rest[rank::replicas])
    else:  # entered in place: nothing copied or walked for the consumed part
        stop = consumed + left // replicas * replicas
        indices = _from(order, consumed + rank, stop, replicas)
    if live is not None:
        indices = itertools.chain(indices, _tail_draw(live, record["n"]))
    if type(index_sampler) is not BatchSampler:
        return indices
    return _batched(indices, index_sampler.batch_size, index_sampler.drop_last)


def _from(order: Sequence[int], start: int, stop: int, step: int) -> Iterator[int]:
    """``order[start:stop:step]`` without copying, entered in O(1) (a list iterator is set to its position)."""
    if isinstance(order, range):
        return iter(order[start:stop:step])
    iterator = iter(order)
    iterator.__setstate__(start)
    return iterator if step == 1 and stop == len(order) else itertools.islice(iterator, 0, max(stop - start, 0), step)


def _tail_draw(generator: torch.Generator, n: int) -> Iterator[Any]:
    # RandomSampler draws one more (empty) permutation from its own generator when its epoch ends.
    torch.randperm(n, generator=generator)
    yield from ()


def _batched(indices: Iterator[Any], batch_size: int, drop_last: bool) -> Iterator[list[Any]]:
    while True:
        batch = list(itertools.islice(indices, batch_size))
        if not batch or (drop_last and len(batch) < batch_size):
            return
        yield batch
