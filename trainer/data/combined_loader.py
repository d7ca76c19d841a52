"""``CombinedLoader``: several dataloaders iterated as one, as in Lightning.

``Trainer.fit`` wraps a list, tuple or dict of training DataLoaders in ``CombinedLoader(..., "max_size_cycle")``,
so ``training_step`` gets ``[batch_a, batch_b]`` (or ``{"a": batch_a, "b": batch_b}``) each step. Modes:

===================  =====================================================================  ==================
mode                 one step gets                                                          batches per epoch
===================  =====================================================================  ==================
``max_size_cycle``   a batch of every loader; shorter loaders start over until the longest  the longest's
                     is done (the training default)
``min_size``         a batch of every loader, until the shortest is done                    the shortest's
``max_size``         a batch of every loader; a finished loader gives ``None``             the longest's
``sequential``       one batch: all of the first loader's, then the second's, ...           the sum
===================  =====================================================================  ==================

Iterating a ``CombinedLoader`` yourself yields ``(batch, batch_idx, dataloader_idx)`` as Lightning's does
(``dataloader_idx`` is 0 except in ``sequential`` mode). Under a distributed strategy each loader gets its own
distributed sampler, and a fit resumed mid-epoch continues every loader at its exact position
(:mod:`trainer.checkpoint.data_position`). Evaluation stages run a list or dict of loaders one after the other
(``sequential``); a CombinedLoader in another mode gives each evaluation step one batch of every loader. Lists and
dicts may nest (``{"a_b": [dl_a, dl_b], "c": dl_c}``); batches come back in the same shape.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional

from torch import Tensor

from trainer.strategies.errors import ConfigurationError

MODES = ("max_size_cycle", "min_size", "max_size", "sequential")

#: ``start(i, skip, saved)`` → an iterator over loader ``i``, ``skip`` batches in (``saved``: its position state).
StartLoader = Callable[[int, int, Optional[dict]], Iterator[Any]]


def is_loader_like(value: Any) -> bool:
    """Something that yields batches when iterated: a DataLoader, a CombinedLoader or another iterable (not a
    tensor, string or mapping, whose iteration yields rows, characters or keys)."""
    return hasattr(value, "__iter__") and not isinstance(value, (Tensor, str, bytes, Mapping))


def training_batches(loader: Any) -> Iterator[Any]:
    """The batches a step gets from ``loader``: for a CombinedLoader its combined batches (iterating one yields
    ``(batch, batch_idx, dataloader_idx)``), else what iterating the loader gives."""
    return loader.batches() if isinstance(loader, CombinedLoader) else iter(loader)


class CombinedLoader:
    """Iterate a list, tuple or dict of dataloaders together (``mode`` as in the module docstring).

    ``CombinedLoader({"labelled": dl_a, "unlabelled": dl_b}, mode="max_size_cycle")``; one loader alone is
    accepted too (its batches are not wrapped).
    """

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ConfigurationError(f"CombinedLoader(mode={mode!r}) is not a mode; use one of {', '.join(MODES)}.")
        loaders, spec = _flatten(iterables)
        if not loaders:
            raise ConfigurationError("CombinedLoader needs at least one dataloader; it got an empty collection.")
        for path, loader in zip(_paths(spec), loaders):
            if not is_loader_like(loader):
                raise ConfigurationError(
                    f"CombinedLoader: entry {path} is a {type(loader).__name__}, which does not yield batches when "
                    "iterated. Each entry must be a torch DataLoader (or another iterable of batches)."
                )
        self._iterables = iterables
        self._spec = spec
        self._loaders = loaders
        self.mode = mode

    # ------------------------------------------------------------------ structure
    @property
    def iterables(self) -> Any:
        """The loaders in the shape this was built from: one loader, or the (nested) list, tuple or dict."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The loaders in order (a dict's in its key order; nested lists and dicts depth first)."""
        return list(self._loaders)

    def with_loaders(self, loaders: list[Any]) -> "CombinedLoader":
        """A CombinedLoader of the same shape and mode over ``loaders`` (e.g. with distributed samplers injected)."""
        if len(loaders) != len(self._loaders):
            raise ValueError(f"with_loaders: expected {len(self._loaders)} loaders, got {len(loaders)}.")
        return CombinedLoader(_unflatten(list(loaders), self._spec), self.mode)

    def pack(self, batches: list[Any]) -> Any:
        """One batch per loader → the shape the loaders were given in (nested list, tuple, dict, or the batch)."""
        return _unflatten(batches, self._spec)

    @property
    def sampler(self) -> Any:
        """Each loader's sampler, in the shape the loaders were given in."""
        return self.pack([getattr(loader, "sampler", None) for loader in self._loaders])

    def __len__(self) -> int:
        """Batches per epoch in this mode; ``TypeError`` when a loader has no length."""
        lengths = [len(loader) for loader in self._loaders]
        if self.mode == "min_size":
            return min(lengths)
        if self.mode == "sequential":
            return sum(lengths)
        return max(lengths)

    # ------------------------------------------------------------------ iteration
    def batches(self, start: Optional[StartLoader] = None, resume: Optional[dict[str, Any]] = None) -> "CombinedIterator":
        """An iterator over the combined batches (what ``training_step`` gets); ``start`` creates each loader's
        iterator, ``resume`` is a :meth:`CombinedIterator.state_dict` to continue from."""
        loaders = self._loaders
        return CombinedIterator(self, start or (lambda i, skip, saved: iter(loaders[i])), resume)

    def __iter__(self) -> Iterator[tuple[Any, int, int]]:
        """``(batch, batch_idx, dataloader_idx)`` as Lightning yields them."""
        iterator = self.batches()
        index, loader_idx = 0, 0
        for batch in iterator:
            if self.mode == "sequential" and iterator.current != loader_idx:
                index, loader_idx = 0, iterator.current
            yield batch, index, loader_idx
            index += 1

    def __repr__(self) -> str:
        return f"CombinedLoader(mode={self.mode!r}, loaders={len(self._loaders)})"


class CombinedIterator:
    """One pass over a :class:`CombinedLoader` in its mode. Counts what it took from each loader, so a resumed fit
    can start every loader where it was (:meth:`state_dict`)."""

    def __init__(self, combined: CombinedLoader, start: StartLoader, resume: Optional[dict[str, Any]] = None) -> None:
        self.combined = combined
        self.mode = combined.mode
        self.start = start
        count = len(combined.flattened)
        self.consumed = [0] * count  # batches taken from each loader's current pass
        self.finished = [False] * count  # loader ran out (max_size_cycle: at least once)
        self.current = 0  # sequential: the loader being read
        saved_children: list[Optional[dict]] = [None] * count
        if resume is not None:
            self.consumed = list(resume["consumed"])
            self.finished = list(resume["finished"])
            self.current = int(resume["current"])
            saved_children = list(resume.get("children") or saved_children)
        self.iterators: list[Optional[Iterator[Any]]] = [None] * count
        if self.mode == "sequential":
            if self.current < count:
                self.iterators[self.current] = start(self.current, self.consumed[self.current],
                                                     saved_children[self.current])  # fmt: skip
        else:
            for i in range(count):
                if not (self.mode == "max_size" and self.finished[i]):
                    self.iterators[i] = start(i, self.consumed[i], saved_children[i])

    def __iter__(self) -> "CombinedIterator":
        return self

    def _next_of(self, i: int) -> Any:
        batch = next(self.iterators[i])
        self.consumed[i] += 1
        return batch

    def __next__(self) -> Any:
        if self.mode == "sequential":
            return self._next_sequential()
        batches: list[Any] = []
        for i, iterator in enumerate(self.iterators):
            if iterator is None:  # max_size: this loader is done
                batches.append(None)
                continue
            try:
                batches.append(self._next_of(i))
            except StopIteration:
                self.finished[i] = True
                if self.mode == "min_size" or all(self.finished):
                    raise
                if self.mode == "max_size":
                    self.iterators[i] = None
                    batches.append(None)
                    continue
                self.iterators[i] = self.start(i, 0, None)  # max_size_cycle: this loader starts over
                self.consumed[i] = 0
                batches.append(self._next_of(i))
        return self.combined.pack(batches)

    def _next_sequential(self) -> Any:
        count = len(self.iterators)
        while self.current < count:
            try:
                return self._next_of(self.current)
            except StopIteration:
                self.finished[self.current] = True
                self.iterators[self.current] = None
                self.current += 1
                if self.current < count:
                    self.iterators[self.current] = self.start(self.current, 0, None)
        raise StopIteration

    def state_dict(self) -> dict[str, Any]:
        """Where each loader stands (plain values)."""
        return {"mode": self.mode, "consumed": list(self.consumed), "finished": list(self.finished),
                "current": self.current}  # fmt: skip


# ---------------------------------------------------------------------- nested containers of loaders
#: A structure's shape: ``None`` for a leaf (a loader), else ``(container type, keys or None, child shapes)``.
_Spec = Optional[tuple[type, Optional[list[Any]], list[Any]]]


def _flatten(tree: Any) -> tuple[list[Any], _Spec]:
    """Loaders of a (nested) list, tuple or dict, depth first, and the shape to rebuild it (Lightning's pytree). A
    non-empty list or tuple of numbers and strings is one loader (iterating it yields them), as in Lightning."""
    if isinstance(tree, (list, tuple)) and tree and all(isinstance(item, (int, float, str)) for item in tree):
        return [tree], None
    if isinstance(tree, Mapping):
        keys = list(tree)
        children = [_flatten(tree[key]) for key in keys]
        return [leaf for leaves, _ in children for leaf in leaves], (dict, keys, [spec for _, spec in children])
    if isinstance(tree, (list, tuple)):
        children = [_flatten(item) for item in tree]
        return [leaf for leaves, _ in children for leaf in leaves], (type(tree), None, [spec for _, spec in children])
    return [tree], None


def _unflatten(leaves: list[Any], spec: _Spec) -> Any:
    """The inverse of :func:`_flatten`: ``leaves`` (in order) put back into the shape ``spec``."""
    position = iter(leaves)

    def build(node: _Spec) -> Any:
        if node is None:
            return next(position)
        container, keys, children = node
        values = [build(child) for child in children]
        if keys is not None:
            return dict(zip(keys, values))
        return container(values) if container in (list, tuple) else container(*values)  # namedtuple: fields

    return build(spec)


def _paths(spec: _Spec, prefix: str = "") -> list[str]:
    """Each leaf's place, for error messages: ``'b'``, ``1``, ``'a'[1]``."""
    if spec is None:
        return [prefix or "0"]
    _, keys, children = spec
    names = keys if keys is not None else list(range(len(children)))
    return [path for name, child in zip(names, children)
            for path in _paths(child, f"{prefix}[{name!r}]" if prefix else repr(name))]


class DataLoaderIter:
    """What a step written as ``validation_step(self, dataloader_iter)`` (or ``training_step``) gets, as in
    Lightning: ``next(dataloader_iter)`` gives ``(batch, batch_idx, dataloader_idx)``, with the batch as the loader
    yields it (the step moves it to ``self.device``). The loop calls the step again until :attr:`done`.

    ``batches`` is the loader's iterator; ``limit`` the batches the stage may take (``limit_*_batches``)."""

    def __init__(self, batches: Iterator[Any], limit: float, dataloader_idx: int = 0) -> None:
        self._batches = batches
        self._limit = limit
        self.dataloader_idx = dataloader_idx
        self.fetched = 0  # batches handed to the step so far
        self.batch: Any = None  # the last one, for the batch hooks
        self._ahead: Any = _NOTHING

    @property
    def done(self) -> bool:
        """True once the loader (or the stage's batch limit) has nothing more to give."""
        if self.fetched >= self._limit:
            return True
        if self._ahead is _NOTHING:
            self._ahead = next(self._batches, _EXHAUSTED)
        return self._ahead is _EXHAUSTED

    def __iter__(self) -> "DataLoaderIter":
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self.done:
            raise StopIteration
        batch, self._ahead = self._ahead, _NOTHING
        self.batch = batch
        self.fetched += 1
        return batch, self.fetched - 1, self.dataloader_idx


_NOTHING = object()
_EXHAUSTED = object()
