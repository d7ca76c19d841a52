"""Recorded initialisation: build a module on ``meta`` (no memory), remember the initialisation its code performed,
and replay it at materialisation so that every layout gets the weights the same code gives on one device.

While a sharded strategy builds a module (``configure_model`` / ``Trainer.init_module()``), :class:`InitRecorder`
logs every top-level torch call that produces or writes a ``meta`` tensor: factories (``torch.empty``,
``torch.ones``, ``torch.arange`` ...), ``torch.nn.init.*`` calls, in-place writes (``p.data.normal_()``,
``w[0].zero_()``) and the plain arithmetic that computes buffers (a RoPE table). Registration hooks remember which
recorded storage each parameter and buffer came from.

**Random draws are exact whatever the code does to the generators.** A draw on ``meta`` draws nothing, so the
recorder makes each call that draws (every aten op tagged ``nondeterministic_seeded`` it dispatches) also draw,
for real, on scratch memory of the same geometry on the device the build stands for, and keeps the generators'
state from just before it. The default generators and every ``torch.Generator`` passed in therefore move exactly
as in an eager build: a ``torch.manual_seed`` inside ``configure_model``, ``seed_everything``,
``torch.random.fork_rng``, a generator object handed to ``nn.init``, rejection sampling (``trunc_normal_``) all
behave as on one device, and the code after the build sees the generators where the eager build leaves them.
:func:`replay` restores each kept state before running its call again on real memory, so every value is
bit-identical to the eager build; a draw whose result is not used is not replayed at all.

``torch.nn.init.trunc_normal_``, ``orthogonal_``, ``sparse_`` and ``dirac_`` return at once on a ``meta`` tensor;
the recorder sees them ask ``tensor.is_meta`` and records the whole call from its frame, however the function was
reached (a name imported before the build, Hugging Face's table of init functions).

**What each storage holds is tracked**: a storage made by ``torch.empty`` (or ``empty_like``, ``new_empty`` ...) is
undefined until calls overwrite every element of it (element by element where they write part of it); a tensor
computed from an undefined one is undefined. A parameter or buffer whose recorded value is not wholly defined
would hold whatever memory held, on one device too: :func:`undefined_regions` names it before anything is
materialised.

A backward liveness pass keeps replay memory small: a tensor gets real memory only from its last full overwrite
to its last use, and as soon as a parameter is final each rank keeps its local shard and frees the full tensor, so
a model built by its layers' ``reset_parameters()`` and re-initialised by ``self.apply(self._init_weights)`` holds
about one full parameter at a time.
"""
from __future__ import annotations

import inspect
import itertools
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from trainer.strategies.errors import ConfigurationError

#: Calls that overwrite every element of their target without reading it (by ``__name__``; ``torch.nn.init`` and
#: the ``Tensor`` methods share these names).
OVERWRITES = frozenset({
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_", "fill_", "zero_", "random_",
    "exponential_", "cauchy_", "log_normal_", "geometric_", "bernoulli_", "copy_",
})  # fmt: skip
#: ``torch.nn.init`` functions that draw by value (rejection sampling, a QR) and so are run whole on full tensors
#: for a ``DTensor`` (see :class:`~trainer.strategies.speed.deferred_init.FullTensorInit`).
_UNDISPATCHED_INITS = ("trunc_normal_", "orthogonal_", "sparse_", "dirac_")
#: Factories whose result holds whatever memory held.
_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                            "empty_permuted"})  # fmt: skip
#: aten samplers whose number of draws depends on the values they are given (rejection sampling on the inputs).
_VALUE_DEPENDENT_DRAWS = frozenset({"poisson", "_standard_gamma", "_sample_dirichlet", "binomial"})
#: In-place by name, but they change flags, not values.
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad", "rename_"})
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                              "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})  # fmt: skip
_IS_META = torch._C.TensorBase.is_meta


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _is_plain(tensor: Any) -> bool:
    """A tensor holding its own data (``Tensor``, ``Parameter``), not a wrapper such as a ``DTensor``."""
    return isinstance(tensor, torch.Tensor) and type(tensor).__torch_dispatch__ is torch.Tensor.__torch_dispatch__


def _is_plain_meta(value: Any) -> bool:
    return _is_plain(value) and value.is_meta


def _names_meta(value: Any) -> bool:
    """``torch.device("meta")`` or the string ``"meta"`` given as a device."""
    return (isinstance(value, torch.device) and value.type == "meta") or (isinstance(value, str) and value == "meta")


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
class _Draw:
    """The generators' state just before a call that draws (the eager build's state there)."""

    cpu: torch.Tensor
    device_state: Optional[torch.Tensor]  # the build device's own generator (a GPU's), if it has one
    explicit: dict  # id(torch.Generator passed to the call) -> its state


@dataclass(frozen=True)
class _GeneratorAt:
    """A ``torch.Generator`` passed to a recorded call, as it was just before the call."""

    device: torch.device
    state: torch.Tensor

    def make(self) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.set_state(self.state)
        return generator


@dataclass
class _Node:
    func: Callable
    args: tuple
    kwargs: dict
    target: Optional[_Ref]  # the tensor written in place, if any
    overwrite: bool  # the call writes every element of target without reading it
    reads: frozenset  # storage keys read
    creates: list  # (index among the flattened outputs, storage key) of new storages
    draw: Optional[_Draw]  # the generators before the call, for a call that draws random numbers


@dataclass
class _Storage:
    ref: _Ref  # the geometry of the tensor that created the storage
    numel: int  # elements of the storage
    # True: every element holds a value the code computed; False: none does (torch.empty); a bool tensor: which do
    defined: Any = True


@dataclass
class Recording:
    """What :class:`InitRecorder` saw: the calls in order, the storages they created, the generators' states."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # the device the build stands for
    nodes: list = field(default_factory=list)
    storages: dict = field(default_factory=dict)
    default_dtype: torch.dtype = torch.float32
    unhonoured: list = field(default_factory=list)  # why the recording cannot reproduce the build, if it cannot
    replay_peak_bytes: int = 0  # after replay: the most bytes of full tensors it held at once
    keep: list = field(default_factory=list)  # the meta tensors referred to, so their storages stay distinct
    # id(DTensor) -> (the DTensor, the recorded full tensor it was made from): writes to it are writes to that
    sharded: dict = field(default_factory=dict)

    def draws(self) -> list[_Draw]:
        """The kept generator states, in call order."""
        return [node.draw for node in self.nodes if node.draw is not None]


# (module, name) -> [recording, the meta tensor registered, its _Ref when the build ended] of every parameter and
# buffer registered while recording. The tensor's storage is read at materialisation (``param.data = ...`` in the
# build may have rebound it); if a conversion after the build rebound it (the precision's ``module.to(dtype)``),
# the value recorded at the end of the build is used, converted when it is written.
_ORIGINS: "weakref.WeakKeyDictionary[nn.Module, dict[str, list]]" = weakref.WeakKeyDictionary()


class _DrawWatch(TorchDispatchMode):
    """Notes whether the aten ops of one call draw random numbers, and whether any draws by value."""

    def __init__(self) -> None:
        super().__init__()
        self.drew = False
        self.by_value = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.drew = True
            self.by_value = self.by_value or func._overloadpacket.__name__ in _VALUE_DEPENDENT_DRAWS
        return func(*args, **(kwargs or {}))


def _meta_skipping_inits() -> dict:
    """code object -> (function, its parameter names) of the ``torch.nn.init`` functions that return at once on
    ``meta`` (after asking ``tensor.is_meta``)."""
    found = {}
    for name in ("_no_grad_trunc_normal_", "dirac_", "orthogonal_", "sparse_"):
        function = getattr(nn.init, name, None)
        code = getattr(function, "__code__", None)
        if code is not None and "is_meta" in code.co_names:
            found[code] = (function, list(inspect.signature(function).parameters))
    return found


_META_SKIPPING = _meta_skipping_inits()


class InitRecorder(TorchFunctionMode):
    """Context (a ``TorchFunctionMode``) that records the calls building modules on ``meta`` (see module doc).

    ``device`` is the device the build stands for (where an eager build would have put the tensors): random calls
    also draw there on scratch memory, so the generators move as they would have.
    """

    def __init__(self, device: Any = "cpu", recording: Optional[Recording] = None) -> None:
        super().__init__()
        self._resumed = recording is not None  # appending to an earlier recording
        self.recording = recording or Recording(device=torch.device(device))
        self._handles: list[Any] = []
        self._entries: list[list] = []  # the _ORIGINS entries this recorder made
        self._transformers: Any = None
        self._not_sharded: dict[int, Any] = {}  # id -> weakref of DTensors known not to shard a recorded tensor

    def __enter__(self) -> "InitRecorder":
        from torch.nn.modules import module as module_mod

        from trainer.strategies.speed.hf_init import real_device_for_transformers

        if not self._resumed:
            self.recording.default_dtype = torch.get_default_dtype()
        self._handles = [module_mod.register_module_parameter_registration_hook(self._registered),
                         module_mod.register_module_buffer_registration_hook(self._registered)]  # fmt: skip
        self._transformers = real_device_for_transformers(self.recording.device)
        self._transformers.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._transformers is not None:
            self._transformers.__exit__(None, None, None)
            self._transformers = None
        for entry in self._entries:
            tensor = entry[1]
            if tensor.is_meta and _key(tensor) in self.recording.storages:
                entry[2] = _Ref.of(tensor)
        self._entries = []
        return super().__exit__(*exc)

    # ------------------------------------------------------------------ what the build registers
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

    def _sharded_entry(self, tensor: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(``tensor``, the recorded full meta tensor it shards) for a parameter or buffer that a ``DTensor``
        replaced while building; ``None`` for any other tensor. ``parallelize_module`` registers its DTensors (seen
        by :meth:`_registered`); ``fully_shard`` sets them without registering, so they are looked up here."""
        if _is_plain(tensor) or not tensor.is_meta:
            return None
        entry = self.recording.sharded.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry
        missed = self._not_sharded.get(id(tensor))
        if missed is not None and missed() is tensor:
            return None
        for module, origins in list(_ORIGINS.items()):  # index every slot of this recording's modules at once
            for name, (recording, registered, _) in origins.items():
                held = module._parameters.get(name)
                held = module._buffers.get(name) if held is None else held
                if recording is self.recording and held is not None and not _is_plain(held) \
                        and held.shape == registered.shape:  # fmt: skip
                    self.recording.sharded.setdefault(id(held), (held, registered))
        entry = self.recording.sharded.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry
        self._not_sharded[id(tensor)] = weakref.ref(tensor)
        return None

    # ------------------------------------------------------------------ the calls
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _IS_META and args:
            self._guarded(self._meta_skipping_init, args[0])
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        rec = self.recording
        target = inplace_target(name, args, kwargs)
        entry = self._sharded_entry(target) if target is not None and name in OVERWRITES else None
        if entry is not None:
            others = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t is not target]
            if all(_is_plain(t) for t in others):
                # nn.init on a tensor-parallel parameter: recorded (and run) on its full meta tensor instead
                full = entry[1]
                swap = lambda value: full if value is target else value  # noqa: E731
                self._observe(func, name, tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()})
                return target
        out = self._observe(func, name, args, kwargs)
        if name in ("__get__", "detach") and args and isinstance(out, torch.Tensor) and not _is_plain(out) \
                and isinstance(args[0], torch.Tensor):  # fmt: skip
            entry = self._sharded_entry(args[0])
            if entry is not None:
                rec.sharded[id(out)] = (out, entry[1])  # param.data of a DTensor parameter
        return out

    def _observe(self, func: Any, name: str, args: tuple, kwargs: dict) -> Any:
        """Run the call; record it if it makes or writes a recorded meta tensor; if it draws, draw for real."""
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        maybe_meta = not tensors or any(_is_plain_meta(t) for t in tensors)
        if not maybe_meta:  # real tensors (their draws are real), or DTensors: sharding, or a write to a shard
            target = inplace_target(name, args, kwargs)
            if target is not None and not _is_plain(target) and target.is_meta:
                self.recording.unhonoured.append(
                    f"{name} wrote to a {type(target).__name__} (a parameter already sharded, e.g. by "
                    "parallelize_module) from a value the recording cannot follow")
            return func(*args, **kwargs)
        draw = self._capture(leaves)
        watch = _DrawWatch()
        with watch:
            out = func(*args, **kwargs)
        involves_meta = any(_is_plain_meta(t) for t in tensors) or any(_is_plain_meta(t) for t in tree_flatten(out)[0])
        if not involves_meta:
            return out  # a real factory (device="cpu"): it drew for real already
        self._guarded(self._record, func, name, args, kwargs, out, draw if watch.drew else None, watch.by_value)
        if watch.drew:
            self._guarded(self._draw_for_real, func, args, kwargs)
        return out

    def _meta_skipping_init(self, tensor: Any) -> None:
        """``tensor.is_meta`` read by an ``nn.init`` function that returns at once on ``meta``: record the call."""
        if not isinstance(tensor, torch.Tensor) or not tensor.is_meta:
            return
        frame = sys._getframe(1)
        for _ in range(6):
            if frame is None:
                return
            found = _META_SKIPPING.get(frame.f_code)
            if found is not None and frame.f_locals.get("tensor") is tensor:
                break
            frame = frame.f_back
        else:
            return
        function, names = found
        kwargs = {name: frame.f_locals[name] for name in names[1:] if name in frame.f_locals}
        del frame
        name = function.__name__.replace("_no_grad_", "")
        rec = self.recording
        entry = self._sharded_entry(tensor)
        if entry is not None:
            tensor = entry[1]  # a parameter sharded while building (TP, fully_shard): its full tensor
        elif not _is_plain(tensor):
            rec.unhonoured.append(f"{name} on a {type(tensor).__name__} that was sharded while building")
            return
        drawn = name != "dirac_"
        leaves, _ = tree_flatten(((tensor,), kwargs))
        draw = self._capture(leaves) if drawn else None
        self._record(function, name, (tensor,), kwargs, tensor, draw, False)
        if drawn:
            self._draw_for_real(function, (tensor,), kwargs)

    def _guarded(self, method: Callable, *args: Any) -> None:
        try:
            method(*args)
        except Exception as err:  # never break the user's build; the build is redone or refused with the reason
            self.recording.unhonoured.append(f"{getattr(args[0], '__name__', args[0])}: {err}")

    def _capture(self, leaves: list) -> _Draw:
        device = self.recording.device
        device_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        explicit = {id(g): g.get_state() for g in leaves if isinstance(g, torch.Generator)}
        return _Draw(torch.get_rng_state(), device_state, explicit)

    def _draw_for_real(self, func: Any, args: tuple, kwargs: dict) -> None:
        """Run the call on scratch memory of the same geometry on the build's device: every generator involved
        moves exactly as in an eager build (the values are dropped; :func:`replay` draws them again)."""
        device = self.recording.device
        scratch: dict[int, torch.Tensor] = {}

        def real(value: Any) -> Any:
            if _is_plain_meta(value):
                if id(value) not in scratch:
                    scratch[id(value)] = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                                             device=device)  # fmt: skip
                return scratch[id(value)]
            if _names_meta(value):
                return device
            return value

        with torch.no_grad(), torch.device(device):
            func(*tree_map(real, args), **tree_map(real, kwargs))

    def _record(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any, draw: Optional[_Draw],
                by_value: bool) -> None:  # fmt: skip
        rec = self.recording
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        target_tensor = inplace_target(name, args, kwargs)
        if any(not _is_plain(t) for t in tensors):
            if target_tensor is not None and not _is_plain(target_tensor):
                rec.unhonoured.append(f"{name} wrote to a {type(target_tensor).__name__} (a parameter already sharded, "
                                      "e.g. by parallelize_module) while building")  # fmt: skip
            return  # calls on DTensors (sharding itself) are not part of the model's initialisation
        out_leaves, _ = tree_flatten(out)
        known = {_key(t) for t in tensors if t.is_meta}
        creates = []
        for i, t in enumerate(out_leaves):
            if _is_plain_meta(t) and _key(t) not in known and _key(t) not in rec.storages:
                creates.append((i, t))
        target = _Ref.of(target_tensor) if _is_plain_meta(target_tensor) else None
        if not creates and target is None:
            return  # a view, a metadata query or a computation on real tensors: nothing to replay
        for t in tensors:
            if t.is_meta and _key(t) not in rec.storages:
                rec.unhonoured.append(f"{name} used a meta tensor not built while recording (shape {tuple(t.shape)})")
                return
        inputs = [t for t in tensors if t.is_meta and t is not target_tensor]
        if draw is not None and by_value and inputs:
            rec.unhonoured.append(f"{name} draws a number of random values that depends on the values of its inputs")
            return
        inputs_defined = all(_region_defined(rec.storages[_key(t)], _Ref.of(t)) for t in inputs)
        for i, t in creates:
            defined = inputs_defined and name not in _UNINITIALISED and (
                target_tensor is None or _region_defined(rec.storages[_key(target_tensor)], _Ref.of(target_tensor)))
            rec.storages[_key(t)] = _Storage(_Ref.of(t), t.untyped_storage().nbytes() // max(t.element_size(), 1),
                                             defined)  # fmt: skip
            rec.keep.append(t)
        creates = [(i, _key(t)) for i, t in creates]
        rec.keep.extend(t for t in tensors if t.is_meta)
        writes_whole_target = name in OVERWRITES or isinstance(kwargs.get("out"), torch.Tensor)
        overwrite = target is not None and writes_whole_target and _covers(target, rec.storages[target.key])
        reads = {_key(t) for t in tensors if t.is_meta}
        if overwrite and not any(_key(t) == target.key for t in _sources(args, kwargs) if t.is_meta):
            reads.discard(target.key)  # (``x.copy_(x)`` reads x: the target passed again is a source)
        if target is not None:
            storage = rec.storages[target.key]
            if writes_whole_target:
                _set_defined(storage, target, inputs_defined)
            elif name == "__setitem__":
                _setitem_defined(storage, target, args, inputs_defined)
        freeze = _freezer(draw)
        rec.nodes.append(_Node(func, tree_map(freeze, args), tree_map(freeze, kwargs), target, overwrite,
                               frozenset(reads), creates, draw))  # fmt: skip


def _sources(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors a call is given other than in its written position (``out=``, else the first argument)."""
    if isinstance(kwargs.get("out"), torch.Tensor):
        rest: Any = (args, {k: v for k, v in kwargs.items() if k != "out"})
    elif "tensor" in kwargs:
        rest = (args, {k: v for k, v in kwargs.items() if k != "tensor"})
    else:
        rest = (args[1:], kwargs)
    return [t for t in tree_flatten(rest)[0] if isinstance(t, torch.Tensor)]


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


def _mask(storage: _Storage) -> torch.Tensor:
    if not isinstance(storage.defined, torch.Tensor):
        storage.defined = torch.full((storage.numel,), bool(storage.defined), device="cpu")  # (not the build's meta)
    return storage.defined


def _region(mask: torch.Tensor, ref: _Ref) -> torch.Tensor:
    return torch.as_strided(mask, ref.size, ref.stride, ref.offset)


def _region_defined(storage: _Storage, ref: _Ref) -> bool:
    if not isinstance(storage.defined, torch.Tensor):
        return bool(storage.defined)
    return bool(_region(storage.defined, ref).all())


def _set_defined(storage: _Storage, ref: _Ref, defined: bool) -> None:
    if _covers(ref, storage):
        storage.defined = defined
    elif storage.defined is not defined:
        _region(_mask(storage), ref).fill_(defined)


def _setitem_defined(storage: _Storage, ref: _Ref, args: tuple, value_defined: bool) -> None:
    """``target[index] = value``: the elements the index selects hold the value's state, when the index can be
    followed without tensor values (ints, slices, ``None``, ``...``); otherwise nothing is assumed written."""
    if storage.defined is value_defined or len(args) < 2:
        return
    index = args[1]
    parts = index if isinstance(index, tuple) else (index,)
    if any(isinstance(part, torch.Tensor) or (isinstance(part, (list, tuple))) for part in parts):
        if not value_defined:
            _set_defined(storage, ref, False)  # which elements got the undefined value is unknown: all may have
        return
    _region(_mask(storage), ref)[index] = value_defined
    if bool(storage.defined.all()):
        storage.defined = True


def _freezer(draw: Optional[_Draw]) -> Callable[[Any], Any]:
    def freeze(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _Ref.of(value) if value.is_meta else value  # a real tensor is a constant of the build
        if _names_meta(value):
            return _MetaDevice()
        if isinstance(value, torch.Generator) and draw is not None and id(value) in draw.explicit:
            return _GeneratorAt(value.device, draw.explicit[id(value)])
        return value

    return freeze


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


def undefined_regions(origins: dict[str, tuple[Recording, _Ref]]) -> list[str]:
    """Names among ``origins`` whose recorded value is not wholly defined (made by ``torch.empty`` or the like and
    never overwritten everywhere)."""
    return [name for name, (recording, ref) in origins.items()
            if not _region_defined(recording.storages[ref.key], ref)]  # fmt: skip


def forget(module: nn.Module) -> None:
    """Drop the recorded origins of ``module``'s submodules (after materialisation; frees the log)."""
    for owner in module.modules():
        _ORIGINS.pop(owner, None)


def unhonoured_error(recording: Recording) -> ConfigurationError:
    """The error for a build the recording cannot reproduce, naming what it could not and the ways out."""
    return ConfigurationError(
        "This module's initialisation cannot be replayed after building on the meta device: "
        f"{'; '.join(recording.unhonoured[:3])}. Build it with real tensors (trainer.init_module(empty_init=False); "
        "in configure_model the Trainer does this by itself when the model fits in memory), or build it with "
        "empty_init=True and initialise it in init_weights() / its layers' reset_parameters()."
    )


def replay(recording: Recording, targets: dict[int, list[tuple[_Ref, Callable[[torch.Tensor], None]]]],
           device: torch.device) -> None:
    """Run ``recording`` on ``device``; for each storage key in ``targets``, once its value is final, call each
    ``write(full_value)`` with the tensor its ``_Ref`` denotes. The generators are left as they were."""
    if recording.unhonoured:
        raise unhonoured_error(recording)
    if torch.device(device).type != recording.device.type:
        raise ConfigurationError(
            f"The module was built (on meta) for {recording.device} but is materialised on {device}: its random "
            "draws would differ. Build it in the init context of the strategy that runs it."
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

    def resolve(value: Any) -> Any:
        if isinstance(value, _MetaDevice):
            return device
        if isinstance(value, _GeneratorAt):
            return value.make()
        if not isinstance(value, _Ref):
            return value
        if value.key not in values:  # the first full overwrite of a storage whose earlier contents are unused
            ref = recording.storages[value.key].ref
            values[value.key] = torch.empty_strided(ref.size, ref.stride, dtype=ref.dtype, device=device)
            held(values[value.key])
        return torch.as_strided(values[value.key], value.size, value.stride, value.offset)

    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(recording.default_dtype)
    forked = [device] if torch.device(device).type == "cuda" else []
    try:
        with torch.no_grad(), torch.device(device), torch.random.fork_rng(devices=forked):
            for i, node in enumerate(nodes):
                if not real[i]:
                    continue
                if node.draw is not None:
                    _restore(node.draw, device)
                args = tree_map(resolve, node.args)
                kwargs = tree_map(resolve, node.kwargs)
                try:
                    out = node.func(*args, **kwargs)
                except Exception as err:
                    raise ConfigurationError(
                        f"Replaying the module's initialisation failed at {getattr(node.func, '__name__', node.func)}: "
                        f"{err}. Build with real tensors (trainer.init_module(empty_init=False)), or with "
                        "empty_init=True and init_weights() / reset_parameters()."
                    ) from err
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


def _restore(draw: _Draw, device: torch.device) -> None:
    torch.set_rng_state(draw.cpu)
    if draw.device_state is not None:
        torch.cuda.set_rng_state(draw.device_state, device)
