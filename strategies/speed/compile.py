"""``compile=``: ``torch.compile`` applied to a module after its strategy has placed and wrapped it.

What is compiled is a module's ``forward`` (what ``self(x)`` runs inside a step), never the step itself: a
``training_step`` keeps running eagerly, so ``self.log`` and any Python in it work unchanged. A module without
``forward`` (its steps call ``self.net(x)``) gets each submodule with a forward compiled instead (looking
through ``nn.ModuleList``/``nn.ModuleDict``): what the steps run; a submodule never called compiles nothing. Where each
strategy compiles (``Strategy.compile_module``):

- one device, DDP, ZeRO: the user's module's ``forward``. Under DDP that forward runs inside DDP's own
  forward, so Dynamo sees the active DDP module and its DDPOptimizer splits the graph at the gradient
  buckets' boundaries: each bucket's all-reduce still overlaps the backward of the layers before it.
- FSDP2: each FSDP unit (the wrapped blocks) is compiled on its own, as torchtitan does; FSDP's all-gather
  and reduce-scatter hooks stay eager around each compiled block. Without units, the module's forward.

The compiled forward is installed on the instance (``module.forward``), so parameters keep their names: a
checkpoint of a compiled module has the plain keys (no ``_orig_mod.``) and loads into an uncompiled one and
back. Copies (``copy.deepcopy``, pickling) compile their own forward.

Recompiles are bounded with torch's default ``dynamic=None`` ("automatic dynamic"): the first batch shape
compiles a static graph; a different one (a short last batch) recompiles once with that dimension dynamic;
evaluation (``eval()`` and ``no_grad``) compiles its own graph. After that nothing recompiles. With
``dynamic=False`` every new shape compiles again (up to torch's recompile limit): give the loaders
``drop_last=True`` then.
"""
from __future__ import annotations

import types
from typing import Any, Optional

from torch import nn

from trainer.strategies.errors import ConfigurationError

COMPILE_OPTIONS = ("mode", "dynamic", "fullgraph", "backend", "options")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_compile(value: Any, argument: str = "compile") -> Optional[dict[str, Any]]:
    """``compile=`` normalised: ``None`` (off), or the keyword arguments for ``torch.compile``.

    Accepts ``False``/``None`` (off), ``True`` (torch's defaults: inductor) or a dict with any of ``mode``,
    ``dynamic``, ``fullgraph``, ``backend`` and ``options``; anything else raises naming what is accepted.
    """
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{argument}={value!r} is not understood. Use True (torch.compile's defaults) or a dict of torch.compile "
            f"options with keys from {COMPILE_OPTIONS}, e.g. {argument}={{'mode': 'max-autotune'}}."
        )
    unknown = sorted(set(value) - set(COMPILE_OPTIONS))
    if unknown:
        raise ConfigurationError(f"{argument} has unknown option(s) {unknown}; the options are {COMPILE_OPTIONS}.")
    mode, dynamic, fullgraph = value.get("mode"), value.get("dynamic"), value.get("fullgraph", False)
    if mode is not None and mode not in COMPILE_MODES:
        raise ConfigurationError(f"{argument}['mode']={mode!r} is not a torch.compile mode; use one of {COMPILE_MODES}.")
    if mode is not None and value.get("options") is not None:
        raise ConfigurationError(f"{argument}: give 'mode' or 'options', not both (torch.compile accepts one of them).")
    if dynamic not in (None, True, False):
        raise ConfigurationError(f"{argument}['dynamic']={dynamic!r} must be None (automatic), True or False.")
    if not isinstance(fullgraph, bool):
        raise ConfigurationError(f"{argument}['fullgraph']={fullgraph!r} must be True or False.")
    options = value.get("options")
    if options is not None and not isinstance(options, dict):
        raise ConfigurationError(f"{argument}['options']={options!r} must be a dict of backend options.")
    backend = value.get("backend")
    if isinstance(backend, str):
        from torch._dynamo import list_backends

        known = list_backends(exclude_tags=())
        if backend not in known:
            raise ConfigurationError(f"{argument}['backend']={backend!r} is not a torch.compile backend; known: {known}.")
    elif backend is not None and not callable(backend):
        raise ConfigurationError(f"{argument}['backend']={backend!r} must be a backend name or a callable backend.")
    return dict(value)


class CompiledForward:
    """A module's forward compiled with ``torch.compile``, installed as the instance's ``forward``.

    ``inner`` is the instance forward it replaced (e.g. an activation-checkpointed one), else the class's.
    """

    def __init__(self, module: nn.Module, options: dict[str, Any], inner: Any = None) -> None:
        import torch

        self.module = module
        self.options = dict(options)
        self.inner = inner
        target = inner if inner is not None else types.MethodType(type(module).forward, module)
        self._compiled = torch.compile(target, **self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)

    def __reduce__(self) -> Any:
        # A copy compiles its own forward: the compiled function holds the original module.
        return (type(self), (self.module, self.options, self.inner))


def compile_forward(module: nn.Module, options: dict[str, Any]) -> None:
    """Compile ``module``'s forward in place; calling it again with the same options does nothing."""
    current = module.__dict__.get("forward")
    if isinstance(current, CompiledForward):
        if current.options == options:
            return
        current = current.inner
    if current is None and not _has_forward(module):
        children = _called_children(module)
        if not children:
            raise ConfigurationError(
                f"compile compiles the module's forward, or without one its submodules' forwards, but "
                f"{type(module).__name__} defines no forward and has no submodule with one, so nothing would be "
                "compiled. Define forward(), or drop compile=."
            )
        for child in children:
            compile_forward(child, options)
        return
    module.forward = CompiledForward(module, options, current)


def _has_forward(module: nn.Module) -> bool:
    forward = type(module).forward
    return not (forward is nn.Module.forward or getattr(forward, "_not_implemented", False))


def _called_children(module: nn.Module) -> list[nn.Module]:
    """What the steps of a module without ``forward`` call: its submodules with a forward, looking through
    containers without one (``nn.ModuleList``, ``nn.ModuleDict``) and modules without one."""
    found: list[nn.Module] = []
    for child in module.children():
        if _has_forward(child) or isinstance(child.__dict__.get("forward"), CompiledForward):
            found.append(child)
        else:
            found.extend(_called_children(child))
    return found


def is_compiled(module: nn.Module) -> bool:
    """True when ``module`` or one of its submodules has a forward installed by :func:`compile_forward`."""
    return any(isinstance(m.__dict__.get("forward"), CompiledForward) for m in module.modules())
