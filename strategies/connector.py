"""Turn the user-facing ``accelerator``/``devices``/``num_nodes``/``strategy``/``precision`` arguments
into one configured Strategy. Shared by the Trainer and the Engine so both validate identically."""
from __future__ import annotations

from typing import Any

from strategies.accelerators import parse_devices, resolve_accelerator
from strategies.errors import ConfigurationError
from strategies.precision import precision_plugin
from strategies.registry import create_strategy
from strategies.strategy import Strategy


def build_strategy(
    accelerator: Any = "auto",
    devices: Any = "auto",
    num_nodes: Any = 1,
    strategy: Any = "auto",
    precision: Any = "32-true",
) -> Strategy:
    """Resolve and validate the five arguments; returns a Strategy ready for ``setup_environment``."""
    plugin = precision_plugin(precision)
    kind = resolve_accelerator(accelerator)
    device_list = parse_devices(kind, devices)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ConfigurationError(f"num_nodes={num_nodes!r} must be a positive integer.")
    if isinstance(strategy, Strategy):
        instance = strategy
    elif isinstance(strategy, str):
        name = strategy.lower()
        if name == "auto":
            name = "single_device" if len(device_list) * num_nodes == 1 and not _launched_externally() else "ddp"
        instance = create_strategy(name)
    else:
        raise ConfigurationError(
            f"strategy={strategy!r} must be a strategy name (e.g. 'ddp') or a Strategy instance."
        )
    instance.connect(device_list, num_nodes, plugin)
    return instance


def _launched_externally() -> bool:
    """True inside a multi-process job started by torchrun/SLURM (the strategy must join it)."""
    try:
        from strategies.environments import detect_environment
    except ImportError:
        return False
    env = detect_environment()
    return env is not None and env.world_size() > 1
