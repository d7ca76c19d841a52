"""Hardware profiles: what one accelerator computes and moves per second, for the step-time bounds of a plan."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Union

from trainer.strategies.errors import ConfigurationError

_GB = 1e9


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """One device's figures (dense, no sparsity): FLOP/s by compute dtype, memory and bandwidths in bytes (per second).

    ``intra_node_bw`` is one device's bandwidth to its node's peers (NVLink), ``inter_node_bw`` its share of the
    network (InfiniBand / RoCE) towards other nodes."""

    name: str
    flops: dict[str, float]
    memory_bytes: int
    hbm_bw: float
    intra_node_bw: float
    inter_node_bw: float

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s when computing in ``dtype`` (``"bf16"``, ``"fp16"``, ``"fp8"``, ``"fp32"``)."""
        if dtype not in self.flops:
            raise ConfigurationError(
                f"The hardware profile {self.name!r} has no FLOP/s for {dtype}; it lists {sorted(self.flops)}. "
                f"Add `{dtype}: <FLOP/s>` under `flops:` in its YAML."
            )
        return self.flops[dtype]


def _profile(name: str, bf16_tflops: float, fp32_tflops: float, fp8_tflops: float, memory_gb: float, hbm_tbs: float,
             nvlink_gbs: float, network_gbs: float) -> HardwareProfile:  # fmt: skip
    flops = {"bf16": bf16_tflops * 1e12, "fp16": bf16_tflops * 1e12, "fp32": fp32_tflops * 1e12}
    if fp8_tflops:
        flops["fp8"] = fp8_tflops * 1e12
    return HardwareProfile(name, flops, int(memory_gb * 2**30), hbm_tbs * 1e12, nvlink_gbs * _GB, network_gbs * _GB)


#: Vendor datasheet figures (dense): SXM parts, NVLink per direction, one 400 Gb/s NIC per GPU (50 GB/s).
BUILT_IN: dict[str, HardwareProfile] = {
    "a100": _profile("a100", 312, 19.5, 0, 80, 2.039, 300, 25),
    "h100": _profile("h100", 989, 67, 1979, 80, 3.35, 450, 50),
    "h200": _profile("h200", 989, 67, 1979, 141, 4.8, 450, 50),
    "b200": _profile("b200", 2250, 80, 4500, 180, 8.0, 900, 50),
}

_FIELDS = ("flops", "memory_bytes", "hbm_bw", "intra_node_bw", "inter_node_bw")


def load_profile(spec: Union[str, Path]) -> HardwareProfile:
    """A built-in profile by name (``h100``, ``h200``, ``a100``, ``b200``) or one read from a YAML file with the
    keys ``name``, ``flops`` (a mapping dtype → FLOP/s), ``memory_bytes``, ``hbm_bw``, ``intra_node_bw``,
    ``inter_node_bw`` (bytes per second)."""
    key = str(spec).lower()
    if key in BUILT_IN:
        return BUILT_IN[key]
    path = Path(spec)
    if not path.is_file():
        raise ConfigurationError(
            f"--hardware {spec}: not a built-in profile ({', '.join(BUILT_IN)}) nor a YAML file. Write one with the "
            f"keys name, {', '.join(_FIELDS)} (see docs/gpu_memory.md)."
        )
    import yaml

    data: Any = yaml.safe_load(path.read_text()) or {}
    missing = [field for field in _FIELDS if field not in data] if isinstance(data, dict) else list(_FIELDS)
    if missing:
        raise ConfigurationError(f"--hardware {spec}: the profile lacks {', '.join(missing)} (needs {', '.join(_FIELDS)}).")
    try:
        flops = {str(k): float(v) for k, v in dict(data["flops"]).items()}
        return HardwareProfile(str(data.get("name", path.stem)), flops, int(float(data["memory_bytes"])),
                               float(data["hbm_bw"]), float(data["intra_node_bw"]), float(data["inter_node_bw"]))  # fmt: skip
    except (TypeError, ValueError) as err:
        raise ConfigurationError(f"--hardware {spec}: {err}; flops is a mapping of dtype to numbers, the rest numbers.") from None
