"""Recorded initialisation: build a module on ``meta`` (no memory), remember the initialisation its code performed,
and replay it at materialisation so that every layout gets the weights the same code gives on one device.

While a sharded strategy builds a module (``configure_model`` / ``Trainer.init_module()``), :class:`InitRecorder`
logs every top-level torch call that produces or writes a tensor: factories (``torch.empty``, ``torch.ones``,
``torch.arange`` ...), ``torch.nn.init.*`` calls, in-place writes (``p.data.normal_()``, ``w[0].zero_()``) and the
plain arithmetic that computes buffers (a RoPE table), together with the random generator's state at the start.
Registration hooks remember which recorded storage each parameter and buffer came from.

:func:`replay` runs the log again, in order, on real memory from the recorded generator state: each random draw
happens in the same order, on the same shapes, as in the eager build, so every value is bit-identical to building
the module on one device. A backward liveness pass keeps memory small: a tensor gets real memory only from its
last full overwrite (``normal_`` over the whole of it, say) to its last use; earlier draws into it run on a
scratch buffer of the same geometry (they only advance the generator), so a model built by its layers'
``reset_parameters()`` and then re-initialised by ``self.apply(self._init_weights)`` holds about one full
parameter at a time. As soon as a parameter is final, each rank keeps its local shard and frees the full tensor.
"""
from __future__ import annotations

import functools
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from trainer.strategies.errors import ConfigurationError

#: Calls that overwrite every element of their target without reading it (by ``__name__``; ``torch.nn.init`` and
#: the ``Tensor`` methods share these names).
OVERWRITES = frozenset({
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_", "fill_", "zero_", "random_",
    "exponential_", "cauchy_", "log_normal_", "geometric_", "bernoulli_", "copy_",
})  # fmt: skip
#: Fragments of the names of calls that draw from the random generator: such a call is replayed (on scratch
#: memory if its result is not needed) so that later draws see the generator as the eager build did.
_RANDOM = ("rand", "normal", "uniform", "bernoulli", "multinomial", "exponential", "cauchy", "geometric",
           "orthogonal", "sparse", "kaiming", "xavier", "dropout", "poisson")  # fmt: skip
_UNDISPATCHED_INITS = ("trunc_normal_", "orthogonal_", "sparse_", "dirac_")
#: In-place by name, but they change flags, not values.
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad", "rename_"})
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                              "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})  # fmt: skip


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _is_plain(tensor: Any) -> bool:
    """A tensor holding its own data (``Tensor``, ``Parameter``), not a wrapper such as a ``DTensor``."""
    return isinstance(tensor, torch.Tensor) and type(tensor).__torch_dispatch__ is torch.Tensor.__torch_dispatch__


@dataclass(frozen=True)
class _Ref:
    """A recorded meta tensor: the storage it lives in and its geometry there."""

    key: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    @staticmethod
    def of(tensor: torch.Tensor) -> "_Ref":
        return _Ref(_key(tensor), tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), tensor.dtype)

    def numel(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n


class _MetaDevice:
    """Stands for ``torch.device("meta")`` in a recorded call: the replay device goes there."""


@dataclass
class _Node:
    func: Callable
    args: tuple
    kwargs: dict
    target: Optional[_Ref]  # the tensor written in place, if any
    overwrite: bool  # the call writes every element of target without reading it
    reads: frozenset  # storage keys read
    creates: list  # (index among the flattened outputs, storage key) of new storages
    random: bool


@dataclass
class _Storage:
    ref: _Ref  # the geometry of the tensor that created the storage
    numel: int  # elements of the storage


@dataclass
class Recording:
    """What :class:`InitRecorder` saw: the calls in order, the storages they created, the generator's state."""

    nodes: list = field(default_factory=list)
    storages: dict = field(default_factory=dict)
    cpu_rng: Optional[torch.Tensor] = None
    cuda_rng: Optional[list] = None
    default_dtype: torch.dtype = torch.float32
    unhonoured: list = field(default_factory=list)  # why the recording cannot reproduce the build, if it cannot
    replay_peak_bytes: int = 0  # after replay: the most bytes of full tensors it held at once
    keep: list = field(default_factory=list)  # the meta tensors referred to, so their storages stay distinct
    # id(DTensor) -> (the DTensor, the recorded full tensor it was made from): writes to it are writes to that
    sharded: dict = field(default_factory=dict)
    init_weights_recorded: bool = False  # the root's init_weights() is in the log (see record_init_weights)


# (module, name) -> [recording, the meta tensor registered, its _Ref when the build ended] of every parameter and
# buffer registered while recording. The tensor's storage is read at materialisation (``param.data = ...`` in the
# build may have rebound it); if a conversion after the build rebound it (the precision's ``module.to(dtype)``),
# the value recorded at the end of the build is used, converted when it is written.
_ORIGINS: "weakref.WeakKeyDictionary[nn.Module, dict[str, list]]" = weakref.WeakKeyDictionary()


class InitRecorder(TorchFunctionMode):
    """Context (a ``TorchFunctionMode``) that records the calls building modules on ``meta`` (see module doc)."""

    def __init__(self, recording: Optional[Recording] = None) -> None:
        super().__init__()
        self._resumed = recording is not None  # appending to an earlier recording (see record_init_weights)
        self.recording = recording or Recording()
        self._handles: list[Any] = []
        self._entries: list[list] = []  # the _ORIGINS entries this recorder made
        self._patched: dict[str, Callable] = {}

    def __enter__(self) -> "InitRecorder":
        rec = self.recording
        if not self._resumed:
            rec.cpu_rng = torch.get_rng_state()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                rec.cuda_rng = torch.cuda.get_rng_state_all()
            rec.default_dtype = torch.get_default_dtype()
        from torch.nn.modules import module as module_mod

        self._handles = [module_mod.register_module_parameter_registration_hook(self._registered),
                         module_mod.register_module_buffer_registration_hook(self._registered)]  # fmt: skip
        # These torch.nn.init functions neither dispatch to torch-function modes nor do anything on meta (their
        # draws depend on values: rejection sampling, a QR), so they are recorded whole, while building, through
        # the module attribute (code that imported the function itself before the build is not seen).
        self._patched = {name: getattr(nn.init, name) for name in _UNDISPATCHED_INITS}
        for name, original in self._patched.items():
            setattr(nn.init, name, self._recorded_init(original))
        return super().__enter__()

    def _recorded_init(self, original: Callable) -> Callable:
        def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if isinstance(tensor, torch.Tensor) and (tensor.is_meta or id(tensor) in self.recording.sharded):
                self._record(original, (tensor, *args), kwargs, tensor)
                return tensor
            return original(tensor, *args, **kwargs)

        return functools.wraps(original)(init)

    def __exit__(self, *exc: Any) -> Any:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name, original in self._patched.items():
            setattr(nn.init, name, original)
        self._patched = {}
        for entry in self._entries:
            tensor = entry[1]
            if tensor.is_meta and _key(tensor) in self.recording.storages:
                entry[2] = _Ref.of(tensor)
        self._entries = []
        return super().__exit__(*exc)

    def _registered(self, module: nn.Module, name: str, tensor: Optional[torch.Tensor]) -> None:
        origins = _ORIGINS.setdefault(module, {})
        if tensor is None:
            origins.pop(name, None)
        elif _is_plain(tensor) and tensor.is_meta and _key(tensor) in self.recording.storages:
            origins[name] = [self.recording, tensor, None]
            self._entries.append(origins[name])
        elif not _is_plain(tensor) and name in origins and tensor.shape == origins[name][1].shape:
            # a DTensor replacing the recorded tensor (tensor parallel): its full value is the recorded one
            self.recording.sharded[id(tensor)] = (tensor, origins[name][1])
        else:
            origins.pop(name, None)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._record(func, args, kwargs, out)
        except Exception as err:  # never break the user's build; say at materialisation why it cannot be replayed
            self.recording.unhonoured.append(f"{getattr(func, '__name__', func)}: {err}")
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        rec = self.recording
        name = getattr(func, "__name__", "")
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        target_tensor = inplace_target(name, args, kwargs)
        sharded = rec.sharded.get(id(target_tensor)) if target_tensor is not None else None
        if sharded is not None and sharded[0] is target_tensor and name in OVERWRITES \
                and all(_is_plain(t) for t in tensors if t is not target_tensor):  # fmt: skip
            # nn.init on a tensor-parallel parameter: recorded on its full tensor, sharded when written
            full = sharded[1]
            args = tuple(full if a is target_tensor else a for a in args)
            kwargs = {k: (full if v is target_tensor else v) for k, v in kwargs.items()}
            tensors = [full if t is target_tensor else t for t in tensors]
            target_tensor = full
        elif name in ("__get__", "detach") and args and id(args[0]) in rec.sharded and rec.sharded[id(args[0])][0] is args[0] \
                and isinstance(out, torch.Tensor) and not _is_plain(out):  # fmt: skip
            rec.sharded[id(out)] = (out, rec.sharded[id(args[0])][1])  # param.data of a DTensor parameter
            return
        if any(not _is_plain(t) for t in tensors):
            if target_tensor is not None and not _is_plain(target_tensor):
                rec.unhonoured.append(f"{name} wrote to a {type(target_tensor).__name__} (a parameter already sharded, "
                                      "e.g. by parallelize_module) while building")  # fmt: skip
            return  # calls on DTensors (sharding itself) are not part of the model's initialisation
        out_leaves, _ = tree_flatten(out)
        known = {_key(t) for t in tensors if t.is_meta}
        creates = []
        for i, t in enumerate(out_leaves):
            if isinstance(t, torch.Tensor) and _is_plain(t) and t.is_meta and _key(t) not in known \
                    and _key(t) not in rec.storages:  # fmt: skip
                creates.append((i, _key(t)))
                rec.storages[_key(t)] = _Storage(_Ref.of(t), t.untyped_storage().nbytes() // max(t.element_size(), 1))
                rec.keep.append(t)
        target = _Ref.of(target_tensor) if isinstance(target_tensor, torch.Tensor) and target_tensor.is_meta else None
        if not creates and target is None:
            return  # a view, a metadata query or a computation on real tensors: nothing to replay
        for t in tensors:
            if t.is_meta and _key(t) not in rec.storages:
                rec.unhonoured.append(f"{name} used a meta tensor not built while recording (shape {tuple(t.shape)})")
                return
        rec.keep.extend(t for t in tensors if t.is_meta)
        overwrite = target is not None and name in OVERWRITES and _covers(target, rec.storages[target.key])
        reads = {_key(t) for t in tensors if t.is_meta}
        if overwrite and not any(t is not target_tensor and _key(t) == target.key for t in tensors):
            reads.discard(target.key)
        if kwargs.get("device") == "meta":
            kwargs = {**kwargs, "device": _MetaDevice()}
        rec.nodes.append(_Node(func, tree_map(_freeze, args), tree_map(_freeze, kwargs), target, overwrite,
                               frozenset(reads), creates, any(r in name.lower() for r in _RANDOM)))  # fmt: skip


def inplace_target(name: str, args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The tensor whose values the call ``name`` writes in place, if any."""
    if isinstance(kwargs.get("out"), torch.Tensor):
        return kwargs["out"]
    if name in _NOT_WRITES:
        return None
    if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_")):
        first = kwargs.get("tensor", args[0] if args else None)
        return first if isinstance(first, torch.Tensor) else None
    return None


def _covers(ref: _Ref, storage: _Storage) -> bool:
    """True when ``ref`` is every element of its storage, each once."""
    if ref.numel() != storage.numel:
        return False
    expected = 1
    for size, stride in sorted(zip(ref.size, ref.stride), key=lambda p: p[1]):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def _freeze(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Ref.of(value) if value.is_meta else value  # a real tensor is a constant of the build
    if isinstance(value, torch.device) and value.type == "meta":
        return _MetaDevice()
    return value


def origins_of(module: nn.Module) -> dict[str, tuple[Recording, _Ref]]:
    """Fully-qualified names of ``module``'s meta tensors that have a recorded origin, with that origin."""
    found = {}
    for owner_name, owner in module.named_modules(remove_duplicate=False):
        origins = _ORIGINS.get(owner)
        if not origins:
            continue
        for name, tensor in itertools.chain(owner._parameters.items(), owner._buffers.items()):
            if tensor is not None and name in origins:
                recording, registered, at_end = origins[name]
                if registered.is_meta and _key(registered) in recording.storages:
                    at_end = _Ref.of(registered)
                if at_end is not None:
                    found[f"{owner_name}.{name}" if owner_name else name] = (recording, at_end)
    return found


def forget(module: nn.Module) -> None:
    """Drop the recorded origins of ``module``'s submodules (after materialisation; frees the log)."""
    for owner in module.modules():
        _ORIGINS.pop(owner, None)


def replay(recording: Recording, targets: dict[int, list[tuple[_Ref, Callable[[torch.Tensor], None]]]],
           device: torch.device) -> None:
    """Run ``recording`` on ``device``; for each storage key in ``targets``, once its value is final, call each
    ``write(full_value)`` with the tensor its ``_Ref`` denotes. Leaves the generator where the eager build left it."""
    if recording.unhonoured:
        raise ConfigurationError(
            "This module's initialisation cannot be replayed after building on the meta device: "
            f"{'; '.join(recording.unhonoured[:3])}. Initialise parameters before sharding them in configure_model, "
            "build with real tensors (trainer.init_module(empty_init=False)), or build with empty_init=True and "
            "give the module init_weights() / its layers reset_parameters()."
        )
    nodes = recording.nodes
    live = set(targets)
    real = [False] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):  # backward liveness: which calls produce values that are used
        node = nodes[i]
        writes = {k for _, k in node.creates} | ({node.target.key} if node.target else set())
        if writes & live:
            real[i] = True
            if node.overwrite:
                live.discard(node.target.key)
            live.difference_update(k for _, k in node.creates)
            live |= node.reads
    last_use: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if real[i]:
            for k in itertools.chain(node.reads, (k for _, k in node.creates), [node.target.key] if node.target else []):
                last_use[k] = i
    released: dict[int, list[int]] = {}
    for k, i in last_use.items():
        released.setdefault(i, []).append(k)
    values: dict[int, torch.Tensor] = {}

    total = 0
    recording.replay_peak_bytes = 0

    def held(tensor: torch.Tensor, sign: int = 1) -> None:
        nonlocal total
        total += sign * tensor.untyped_storage().nbytes()
        recording.replay_peak_bytes = max(recording.replay_peak_bytes, total)

    def alloc(ref: _Ref) -> torch.Tensor:
        return torch.empty_strided(ref.size, ref.stride, dtype=ref.dtype, device=device)

    def resolve(value: Any, scratch: bool, target: Optional[_Ref]) -> Any:
        if isinstance(value, _MetaDevice):
            return device
        if not isinstance(value, _Ref):
            return value
        if scratch and (value == target or value.key not in values):
            return alloc(value)
        if value.key not in values:  # the first full overwrite of a storage whose earlier contents are unused
            values[value.key] = alloc(recording.storages[value.key].ref)
            held(values[value.key])
        return torch.as_strided(values[value.key], value.size, value.stride, value.offset)

    _set_rng(recording, device)
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(recording.default_dtype)
    try:
        with torch.no_grad(), torch.device(device):
            for i, node in enumerate(nodes):
                if not real[i] and not node.random:
                    continue
                scratch = not real[i]
                args = tree_map(lambda v: resolve(v, scratch, node.target), node.args)
                kwargs = tree_map(lambda v: resolve(v, scratch, node.target), node.kwargs)
                try:
                    out = node.func(*args, **kwargs)
                except Exception as err:
                    raise ConfigurationError(
                        f"Replaying the module's initialisation failed at {getattr(node.func, '__name__', node.func)}: "
                        f"{err}. Build with real tensors (trainer.init_module(empty_init=False)), or with "
                        "empty_init=True and init_weights() / reset_parameters()."
                    ) from err
                if scratch:
                    continue
                out_leaves, _ = tree_flatten(out)
                for index, k in node.creates:
                    if out_leaves[index].untyped_storage().nbytes() != recording.storages[k].numel * out_leaves[index].element_size():
                        raise ConfigurationError(f"replaying {getattr(node.func, '__name__', node.func)} gave a tensor "
                                                 "laid out differently from the recorded one")  # fmt: skip
                    values[k] = out_leaves[index]
                    held(values[k])
                for k in released.get(i, ()):
                    value = values.pop(k, None)
                    if value is None:
                        continue
                    for ref, write in targets.get(k, ()):
                        write(torch.as_strided(value, ref.size, ref.stride, ref.offset))
                    held(value, -1)
    finally:
        torch.set_default_dtype(previous_dtype)


def _set_rng(recording: Recording, device: torch.device) -> None:
    """The generator of ``device`` as the build found it. A build on ``meta`` draws nothing, so where CUDA was not
    initialised yet when recording began, the GPU's generator still is as it was then."""
    if device.type == "cuda":
        if recording.cuda_rng is not None:
            torch.cuda.set_rng_state(recording.cuda_rng[device.index or 0], device)
    else:
        torch.set_rng_state(recording.cpu_rng)


def record_init_weights(module: nn.Module) -> bool:
    """Append the root's ``init_weights()``, run on the ``meta`` module, to the recording that built it, so that
    its draws replay over the whole model whatever part of it a rank keeps (pipeline parallel cuts the module
    before materialising). False, with nothing appended, when the module was not recorded, defines no
    ``init_weights()``, or its ``init_weights()`` cannot be recorded (e.g. it distributes tensors itself): then
    :func:`~trainer.strategies.speed.deferred_init.materialize` calls it on the materialised module instead."""
    init_weights = getattr(module, "init_weights", None)
    recordings = {id(r): r for r, _ in origins_of(module).values()}
    if not callable(init_weights) or len(recordings) != 1:
        return False
    (recording,) = recordings.values()
    nodes, unhonoured = len(recording.nodes), len(recording.unhonoured)
    try:
        with torch.device("meta"), InitRecorder(recording), torch.no_grad():
            init_weights()
    except Exception:
        recorded = False
    else:
        recorded = len(recording.unhonoured) == unhonoured
    if not recorded:
        del recording.nodes[nodes:], recording.unhonoured[unhonoured:]
    recording.init_weights_recorded = recorded
    return recorded
