"""Turn the user-facing ``accelerator``/``devices``/``num_nodes``/``strategy``/``precision`` arguments
into one configured Strategy. Shared by the Trainer and the Engine so both validate identically."""
from __future__ import annotations

from typing import Any

from trainer.strategies.accelerators import parse_devices, refuse_no_devices, resolve_accelerator
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.precision import precision_plugin
from trainer.strategies.registry import create_strategy
from trainer.strategies.strategy import Strategy


def build_strategy(
    accelerator: Any = "auto",
    devices: Any = "auto",
    num_nodes: Any = 1,
    strategy: Any = "auto",
    precision: Any = "32-true",
    cluster_environment: Any = None,
) -> Strategy:
    """Resolve and validate the five arguments; returns a Strategy ready for ``setup_environment``.

    ``cluster_environment`` (a ``ClusterEnvironment``) replaces detection, for strategies that take one."""
    plugin = precision_plugin(precision)
    refuse_no_devices(accelerator, devices)
    kind = resolve_accelerator(accelerator)
    from trainer.strategies.launch.environments import detect_environment  # on use: keeps `import trainer` light

    job = cluster_environment if cluster_environment is not None else detect_environment()  # torchrun/SLURM/...
    launched = job is not None and job.world_size() > 1
    # "auto" = one device per process already started here; a scheduler that lets the Trainer start them (a
    # Kubeflow pod, a SkyPilot node) leaves it to the devices found
    started = launched and job.creates_processes_externally
    device_list = parse_devices(kind, devices, job.local_world_size() if started else None)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ConfigurationError(f"num_nodes={num_nodes!r} must be a positive integer.")
    if isinstance(strategy, Strategy):
        instance = strategy
    elif isinstance(strategy, str):
        name = strategy.lower()
        if name == "auto":
            name = "single_device" if len(device_list) * num_nodes == 1 and not launched else "ddp"
        instance = create_strategy(name)
    else:
        raise ConfigurationError(
            f"strategy={strategy!r} must be a strategy name (e.g. 'ddp') or a Strategy instance."
        )
    if cluster_environment is not None and getattr(instance, "cluster_environment", None) is None:
        # A one-process strategy keeps it too: SLURM auto-requeue reads its settings from there.
        instance.cluster_environment = cluster_environment
    instance.connect(device_list, num_nodes, plugin)
    return instance
