"""Deferred initialisation: build a module without memory (the ``meta`` device) or without random init, and
give each rank real memory for only the part it holds.

``Trainer.init_module()`` and ``TrainModule.configure_model()`` run inside :meth:`Strategy.module_init_context`,
which uses :func:`module_init_context` here:

- sharded strategies (``"fsdp"``, ``"nd_parallel"``, ...) build on ``meta``: no parameter has storage, and the
  initialisation the module's code performs is recorded (:mod:`trainer.strategies.speed.init_recording`). The
  strategy shards (``fully_shard``, ``parallelize_module``, pipeline stages), then :func:`materialize` gives each
  rank storage for its own shards (``to_empty``) and replays the recorded initialisation, keeping each rank's
  shards: the weights one device would have, bit for bit, on every layout (the Trainer's build includes the
  root's ``init_weights()``, see :mod:`trainer.strategies.speed.module_build`). With ``empty_init=True`` nothing
  is recorded: the module is initialised by ``init_weights()``, else every submodule's ``reset_parameters()``
  (Lightning's contract);
- other strategies build on their device in the precision's dtype ("bf16-true": no float32 copy first);
  ``empty_init=True`` there skips ``torch.nn.init`` (the weights are about to be loaded from a checkpoint).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from trainer.strategies.errors import ConfigurationError


_ALLOCATE_ONLY: list[Any] = [None]


@contextlib.contextmanager
def allocate_only(mode: Any) -> Iterator[None]:
    """Inside this block :func:`materialize` allocates the tensors under ``mode`` (a ``FakeTensorMode``) and leaves
    them uninitialised: a dry run of the set-up (``trainer plan``) needs each rank's shapes, not its values."""
    _ALLOCATE_ONLY[0], before = mode, _ALLOCATE_ONLY[0]
    try:
        yield
    finally:
        _ALLOCATE_ONLY[0] = before


class SkipInit(TorchFunctionMode):
    """``torch.nn.init.*`` calls return their tensor untouched: modules are built with uninitialised memory."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


class _InitContext(contextlib.ExitStack):
    """The contexts a module is built in; ``recording`` is the :class:`~trainer.strategies.speed.init_recording.
    Recording` of a build on ``meta`` (``None`` when nothing is recorded)."""

    recording: Any = None


def module_init_context(device: torch.device, precision: Any, empty_init: Optional[bool], meta: bool) -> _InitContext:
    """Where new modules' tensors go: ``meta`` (``meta=True``; recording the initialisation the code performs, as
    it would run on ``device``, unless ``empty_init`` is true), else ``device`` with ``torch.nn.init`` skipped when
    ``empty_init`` is true; in both, floating tensors get the precision's weight dtype."""
    if empty_init is not None and not isinstance(empty_init, bool):
        raise ConfigurationError(f"empty_init={empty_init!r} must be True, False or None.")
    stack = _InitContext()
    stack.enter_context(torch.device("meta") if meta else torch.device(device))
    stack.enter_context(precision.init_context())
    if empty_init and not meta:
        stack.enter_context(SkipInit())
    elif not meta:  # a build that shards while building (configure_model's TP plan) draws full tensors, as one device
        stack.enter_context(FullTensorInit())
    if meta and not empty_init:  # remember the module's own initialisation, replayed by materialize()
        from trainer.strategies.speed.init_recording import InitRecorder

        recorder = InitRecorder(device)
        stack.recording = recorder.recording
        stack.enter_context(recorder)
    return stack


def has_meta_tensors(module: nn.Module) -> bool:
    """True when any parameter or buffer of ``module`` (or its local shard) is on the ``meta`` device."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if _local(tensor).is_meta:
            return True
    return False


def _owns_tensors(module: nn.Module) -> bool:
    return next(itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)), None) is not None


def materialize(module: nn.Module, device: torch.device) -> bool:
    """Give the ``meta`` tensors of ``module`` storage on ``device`` and initialise them; False if there were none.

    Runs after sharding, so each rank allocates only its shards. A module built while a sharded strategy recorded
    its construction (``configure_model`` with the root's ``init_weights()``, ``Trainer.init_module()``) gets the
    values its own code computes, bit for bit as on one device (:mod:`trainer.strategies.speed.init_recording`).
    Otherwise (built with ``empty_init=True`` or on ``meta`` by hand) the root's ``init_weights()`` or every
    submodule's ``reset_parameters()`` initialises it, each ``torch.nn.init`` call and in-place random fill on a
    sharded tensor drawing the full tensor and keeping the local shard, so the weights do not depend on the layout.
    Tensors that were real before (built outside ``meta``, loaded) keep their values. Either way every element of
    every tensor must be written (:class:`~trainer.strategies.speed.init_coverage.WriteCoverage`), else the error
    names the tensor: nothing trains on whatever memory held. Last, a submodule's ``_after_materialize`` callables
    run (a load asked for while it was on ``meta``).
    """
    from trainer.strategies.speed.init_coverage import WriteCoverage
    from trainer.strategies.speed.init_recording import forget, origins_of, replay

    if not has_meta_tensors(module):
        return False
    if _ALLOCATE_ONLY[0] is not None:  # shapes only: nothing is initialised, so nothing needs to be initialisable
        ties = _tied_slots(module)
        with _ALLOCATE_ONLY[0]:
            module.to_empty(device=device)
        _retie(ties)
        forget(module)
        return True
    origins = origins_of(module)
    named = _unique_named_tensors(module)
    meta_names = [name for name, tensor in named if _local(tensor).is_meta]
    recorded = [name for name in meta_names if name in origins]
    init_weights = getattr(module, "init_weights", None)
    _refuse_what_cannot_be_initialised(module, origins, meta_names, recorded, init_weights)
    kept = {name: _local(tensor).detach() for name, tensor in named if not _local(tensor).is_meta}
    ties = _tied_slots(module)
    module.to_empty(device=device)
    _retie(ties)  # to_empty makes a new Parameter per module from meta, which unties a tied weight
    tensors = dict(_unique_named_tensors(module))
    locals_ = {name: _local(tensor) for name, tensor in tensors.items()}
    if not recorded:  # an init that reads what it did not write reads NaN, and is caught below
        with torch.no_grad():
            for local in locals_.values():
                if local.is_floating_point() or local.is_complex():
                    local.fill_(float("nan"))
    by_recording: dict[int, tuple[Any, dict]] = {}
    for name in recorded:  # a tied weight is one tensor: written once, under its first name
        recording, ref = origins[name]
        targets = by_recording.setdefault(id(recording), (recording, {}))[1]
        targets.setdefault(ref.key, []).append((ref, _writer(tensors[name])))
    for recording, _ in by_recording.values():
        share_draws(recording, device)
    coverage = WriteCoverage(locals_)
    with torch.no_grad(), coverage:
        for name, value in kept.items():
            locals_[name].copy_(value)
        for recording, targets in by_recording.values():
            replay(recording, targets, device)
        if not recorded:
            with FullTensorInit():
                if callable(init_weights):
                    init_weights()
                else:
                    for sub in module.modules():
                        if _owns_tensors(sub):
                            sub.reset_parameters()
    forget(module)
    _refuse_unwritten(coverage, locals_, recorded, init_weights)
    _run_after_materialize(module)
    return True


def _run_after_materialize(module: nn.Module) -> None:
    """What was asked of a submodule while it had no memory (``trainer.hf.load_pretrained`` on ``meta``: the
    weights to load), now that each rank holds its shards; each runs once."""
    for sub in module.modules():
        hooks = sub.__dict__.pop("_after_materialize", None)
        for hook in hooks or ():
            hook()


def _refuse_what_cannot_be_initialised(module: nn.Module, origins: dict, meta_names: list[str], recorded: list[str],
                                       init_weights: Any) -> None:  # fmt: skip
    """Before any memory is given: a build that mixes recorded and unrecorded meta tensors, a recording that
    cannot be replayed or leaves a tensor undefined, or an unrecorded module nothing would initialise."""
    from trainer.strategies.speed.init_recording import undefined_regions, unhonoured_error

    if recorded and len(recorded) < len(meta_names):
        outside = [name for name in meta_names if name not in origins]
        raise ConfigurationError(
            f"{outside[:3]} are meta tensors made outside the recorded build of the rest of the module (e.g. a "
            "submodule built by hand on the meta device, then put into a module built in configure_model), so "
            "nothing says what they hold. Build them inside configure_model / trainer.init_module() too, or build "
            "the whole module with empty_init=True and initialise it in init_weights()."
        )
    if recorded:
        for recording in {id(origins[name][0]): origins[name][0] for name in recorded}.values():
            if recording.unhonoured:
                raise unhonoured_error(recording)
        undefined = undefined_regions({name: origins[name] for name in recorded})
        if undefined:
            raise ConfigurationError(
                f"{undefined[:3]} are never wholly written by the code that builds them (made with torch.empty, "
                "empty_like or new_empty and not filled everywhere): on one device they would hold whatever memory "
                "held, differently on each run. Create them with torch.zeros / torch.ones / a computation, or fill "
                "them (nn.init.*, .zero_()) in the build."
            )
    elif not callable(init_weights):
        missing = sorted({type(sub).__name__ for sub in module.modules()
                          if _owns_tensors(sub) and not callable(getattr(sub, "reset_parameters", None))})  # fmt: skip
        if missing:
            raise ConfigurationError(
                f"{type(module).__name__} was built on the meta device (deferred initialisation), but {missing} "
                "hold parameters or buffers and define no reset_parameters(), so their memory would stay "
                "uninitialised. Give them reset_parameters(), define init_weights() on the module to initialise "
                "everything, or build eagerly with trainer.init_module(empty_init=False)."
            )


def _refuse_unwritten(coverage: Any, locals_: dict[str, torch.Tensor], recorded: list[str], init_weights: Any) -> None:
    """After initialisation: an element nothing wrote, or (an unrecorded init, which started from NaN) a NaN read
    from memory the init had not written yet."""
    unwritten = coverage.unwritten()
    if unwritten:
        how = ("its recorded build" if recorded else
               "init_weights()" if callable(init_weights) else "the reset_parameters() of its layers")  # fmt: skip
        raise ConfigurationError(
            f"After deferred initialisation {unwritten[:3]} were not (wholly) written by {how}: they would hold "
            "whatever memory held. Initialise every parameter and buffer there (a buffer computed in __init__ is "
            "not recomputed by reset_parameters(): compute it in init_weights()), or build eagerly with "
            "trainer.init_module(empty_init=False)."
        )
    if not recorded:
        with torch.no_grad():
            nan = [name for name, local in locals_.items()
                   if (local.is_floating_point() or local.is_complex()) and bool(torch.isnan(local).any())]  # fmt: skip
        if nan:
            raise ConfigurationError(
                f"After deferred initialisation {nan[:3]} hold NaN: the initialisation read memory it had not "
                "written yet (or wrote NaN). Write each tensor before reading it in init_weights()/reset_parameters()."
            )


def _tied_slots(module: nn.Module) -> list[tuple[nn.Module, str, str, nn.Module, str]]:
    """(owner, "_parameters"/"_buffers", name, first owner, first name) of every slot holding a tensor that an
    earlier slot holds too (a tied weight)."""
    first: dict[int, tuple[nn.Module, str, str]] = {}
    ties = []
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(owner, kind).items():
                if tensor is None:
                    continue
                if id(tensor) in first:
                    first_owner, first_kind, first_name = first[id(tensor)]
                    ties.append((owner, kind, name, first_owner, first_name))
                else:
                    first[id(tensor)] = (owner, kind, name)
    return ties


def _retie(ties: list[tuple[nn.Module, str, str, nn.Module, str]]) -> None:
    for owner, kind, name, first_owner, first_name in ties:
        shared = getattr(first_owner, kind)[first_name]
        if getattr(owner, kind)[name] is not shared:
            getattr(owner, kind)[name] = shared


def _unique_named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Each parameter and buffer once (a tied weight under its first name)."""
    return list(itertools.chain(module.named_parameters(), module.named_buffers()))


def share_draws(recording: Any, device: torch.device) -> None:
    """In a multi-process job, replay rank 0's random draws on every rank: a script that seeds each rank
    differently (or not at all) still gets one model, the one rank 0's build describes."""
    import torch.distributed as dist

    draws = recording.draws()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return
    states = [[d.cpu] + ([d.device_state] if d.device_state is not None else []) + list(d.explicit.values())
              for d in draws]  # fmt: skip
    flat = torch.cat([s.reshape(-1) for group in states for s in group]) if states else torch.zeros(0, dtype=torch.uint8)
    on = device if torch.device(device).type == "cuda" else torch.device("cpu")
    digest = torch.tensor([flat.numel(), _checksum(flat)], dtype=torch.int64, device=on)
    low, high = digest.clone(), digest.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if low[0] != high[0]:
        raise ConfigurationError(
            "The module's build draws random numbers a different number of times on different ranks, so no rank's "
            "build describes the model: build the same module on every rank."
        )
    if torch.equal(low, high):
        return
    shared = flat.to(on)
    dist.broadcast(shared, src=0)
    shared = shared.cpu()
    offset = 0
    for draw, group in zip(draws, states):
        for state in group:
            state.copy_(shared[offset: offset + state.numel()].view_as(state))
            offset += state.numel()


def _checksum(flat: torch.Tensor) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(flat.numpy().tobytes(), digest_size=7).digest(), "little")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _named_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    return itertools.chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False))


def _is_dtensor(tensor: Any) -> bool:
    return hasattr(tensor, "device_mesh") and hasattr(tensor, "placements")


def _write_local(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy into ``target`` its part of ``full`` (the whole of it, or a DTensor's local shard)."""
    if _is_dtensor(target):
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = target.to_local()
        full = full.to(local.device)
        if all(type(p) in (Shard, Replicate) for p in target.placements):  # a block of full: copied from a view
            shape, offset = compute_local_shape_and_global_offset(full.shape, target.device_mesh, target.placements)
            block = full
            for dim, (start, length) in enumerate(zip(offset, shape)):
                block = block.narrow(dim, start, length)
            local.copy_(block)
        else:  # strided shards (FSDP over tensor parallel): DTensor's own split
            local.copy_(distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local())
    else:
        target.copy_(full)


def _on_full_tensor(init: Callable) -> Callable:
    def on_full(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not _is_dtensor(tensor):
            return init(tensor, *args, **kwargs)
        full = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.to_local().device)
        init(full, *args, **kwargs)
        _write_local(tensor, full)
        return tensor

    return functools.wraps(init)(on_full)


def _writer(target: torch.Tensor) -> Callable[[torch.Tensor], None]:
    return lambda full: _write_local(target, full)


class FullTensorInit(TorchFunctionMode):
    """``torch.nn.init.*`` calls and in-place random fills on a DTensor draw its full tensor (same on every rank,
    from the same generator state) and keep the local shard: one full parameter at a time, layout-independent."""

    def __enter__(self) -> "FullTensorInit":
        from trainer.strategies.speed.init_recording import _UNDISPATCHED_INITS

        # These do not dispatch to torch-function modes and draw by value (rejection sampling, a QR): on a DTensor
        # each rank would loop on its own shard's values; through the module attribute they run on the full tensor.
        self._patched = {name: getattr(nn.init, name) for name in _UNDISPATCHED_INITS}
        for name, original in self._patched.items():
            setattr(nn.init, name, _on_full_tensor(original))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        for name, original in self._patched.items():
            setattr(nn.init, name, original)
        return super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        from trainer.strategies.speed.init_recording import OVERWRITES, inplace_target

        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = inplace_target(name, args, kwargs)
        if target is None or not _is_dtensor(target) or name not in OVERWRITES or any(
            _is_dtensor(value) and value is not target for value in itertools.chain(args, kwargs.values())
        ):  # (a DTensor source: the code distributes its values itself)
            return func(*args, **kwargs)
        full = torch.empty(target.shape, dtype=target.dtype, device=target.to_local().device)
        swap = lambda value: full if value is target else value  # noqa: E731
        func(*[swap(a) for a in args], **{k: swap(v) for k, v in kwargs.items()})
        _write_local(target, full)
        return target
