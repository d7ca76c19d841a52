"""Accelerator and device resolution: turn ``accelerator=``/``devices=`` into a list of ``torch.device``."""
from __future__ import annotations

import os
from typing import Any, Optional

import torch

from trainer.strategies.errors import ConfigurationError

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def refuse_no_devices(accelerator: Any, devices: Any) -> None:
    """``devices=0``, ``"0"`` or ``[]``: refused before the accelerator is looked for, as Lightning does."""
    if isinstance(devices, bool) or not (devices in (0, "0") or (isinstance(devices, (list, tuple)) and not devices)):
        return
    name = type(accelerator).__qualname__ if isinstance(accelerator, Accelerator) else accelerator
    raise ConfigurationError(f"`Trainer(devices={devices!r})` value is not a valid input using {name} accelerator: "
                             f"no device would run: devices={devices!r} must be at least 1 (or -1 for all, or 'auto').")  # fmt: skip


def resolve_accelerator(accelerator: Any) -> str:
    """Return ``"cpu"``, ``"cuda"`` or ``"mps"`` for an ``accelerator=`` argument (a name, or an
    :class:`Accelerator` object as Lightning takes: ``CPUAccelerator()``), or raise a clear error."""
    if isinstance(accelerator, Accelerator) and accelerator.name:
        accelerator = accelerator.name
    if not isinstance(accelerator, str) or accelerator.lower() not in ACCELERATORS:
        raise ConfigurationError(
            f"You selected an invalid accelerator name: `accelerator={accelerator!r}`. accelerator={accelerator!r} is "
            f"not known. Valid values: {', '.join(repr(a) for a in ACCELERATORS)}."
        )
    name = accelerator.lower()
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if name in ("gpu", "cuda"):
        if torch.cuda.device_count() == 0:
            found = "this PyTorch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
            raise ConfigurationError(
                f"accelerator={accelerator!r} was requested but {found} (torch.cuda.device_count() == 0"
                f"{', CUDA_VISIBLE_DEVICES=' + repr(os.environ['CUDA_VISIBLE_DEVICES']) if 'CUDA_VISIBLE_DEVICES' in os.environ else ''}). "
                "Use accelerator='cpu' (or 'auto') to train on the CPU."
            )
        return "cuda"
    if name == "mps" and not _mps_available():
        raise ConfigurationError("accelerator='mps' was requested but MPS is not available on this machine. Use 'cpu'.")
    return name


def device_count(kind: str) -> int:
    """How many devices of this kind exist (CPU: the number of cores, for information only)."""
    if kind == "cuda":
        return torch.cuda.device_count()
    if kind == "mps":
        return 1 if _mps_available() else 0
    return os.cpu_count() or 1


def parse_devices(kind: str, devices: Any, processes_per_node: Optional[int] = None) -> list[torch.device]:
    """Resolve ``devices=`` (``"auto"``, an int, ``-1`` or a list of indices) for accelerator ``kind``.

    On the CPU ``devices=N`` means N processes, each on ``cpu``. On CUDA/MPS the request is checked against
    what exists, and the error says what was found. ``processes_per_node`` is set when torchrun/SLURM
    already started the processes: ``"auto"`` then means one device per process started on this node.
    """
    if isinstance(devices, str) and devices.strip().lower() == "auto":
        if processes_per_node is None:
            count = device_count(kind) if kind == "cuda" else 1
            return _devices(kind, list(range(count)))
        devices = processes_per_node
    if isinstance(devices, str):
        text = devices.strip().lower()
        try:
            devices = [int(x) for x in text.split(",") if x.strip()] if "," in text else int(text)
        except ValueError:
            raise ConfigurationError(
                f"devices={devices!r} is not understood. Use 'auto', a number of devices (e.g. 2), -1 for all, "
                "or a list of indices (e.g. [0, 1])."
            ) from None
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise ConfigurationError(
            f"devices={devices!r} is not understood. Use 'auto', a number of devices (e.g. 2), -1 for all, "
            "or a list of indices (e.g. [0, 1])."
        )
    available = device_count(kind)
    if isinstance(devices, int):
        if devices == -1:
            devices = available if kind != "cpu" else 1
        if devices < 1:
            raise ConfigurationError(f"`Trainer(devices={devices!r})` value is not a valid input using {kind} "
                                     f"accelerator: devices={devices} must be at least 1 (or -1 for all, or 'auto').")  # fmt: skip
        if kind != "cpu" and devices > available:
            raise ConfigurationError(
                f"devices={devices} {kind.upper()} devices were requested but {available} "
                f"{'was' if available == 1 else 'were'} found. Use devices={available} or fewer"
                f"{', or accelerator=' + repr('cpu') + ' for CPU processes' if kind != 'cpu' else ''}."
            )
        return _devices(kind, list(range(devices)))
    indices = list(devices)
    if not indices or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
        raise ConfigurationError(f"devices={devices!r}: a list of devices must hold non-negative indices, e.g. [0, 1].")
    if len(set(indices)) != len(indices):
        raise ConfigurationError(f"devices={devices!r} names a device twice.")
    if kind == "cpu":
        return _devices(kind, list(range(len(indices))))
    missing = [i for i in indices if i >= available]
    if missing:
        raise ConfigurationError(
            f"devices={devices!r} asks for {kind.upper()} device(s) {missing} but only {available} "
            f"{'is' if available == 1 else 'are'} visible (indices 0..{available - 1})."
        )
    return _devices(kind, indices)


def _devices(kind: str, indices: list[int]) -> list[torch.device]:
    if kind == "cpu":
        return [torch.device("cpu")] * len(indices)
    return [torch.device(kind, i) for i in indices]


class Accelerator:
    """The kind of device a run uses, as Lightning's ``trainer.accelerator`` reports it (``isinstance(
    trainer.accelerator, CUDAAccelerator)``). Devices are chosen by ``Trainer(accelerator=..., devices=...)``;
    this object only describes them."""

    #: ``"cpu"``, ``"cuda"`` or ``"mps"``: the ``torch.device`` type.
    name = ""

    @classmethod
    def is_available(cls) -> bool:
        """Whether this machine has such a device."""
        return device_count(cls.name) > 0

    @classmethod
    def auto_device_count(cls) -> int:
        """How many devices ``devices="auto"`` uses (on the CPU: one process)."""
        return 1 if cls.name == "cpu" else device_count(cls.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class CPUAccelerator(Accelerator):
    """Processes on the CPU."""

    name = "cpu"


class CUDAAccelerator(Accelerator):
    """NVIDIA GPUs through CUDA."""

    name = "cuda"


class MPSAccelerator(Accelerator):
    """Apple silicon GPUs through MPS."""

    name = "mps"


def accelerator_for(device_type: str) -> Accelerator:
    """The :class:`Accelerator` describing devices of ``device_type`` (a ``torch.device`` type)."""
    kinds = {cls.name: cls for cls in (CPUAccelerator, CUDAAccelerator, MPSAccelerator)}
    return kinds.get(device_type, CPUAccelerator)()
