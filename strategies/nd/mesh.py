"""The layout of an N-D parallel job: how many ways data is replicated and sharded, and how many ways each
layer (tensor parallel) and the stack of layers (pipeline parallel) are split, on one ``DeviceMesh``.

The mesh's dimensions run outermost first: ``pp``, ``dp_replicate``, ``dp_shard``, ``tp``. Neighbouring ranks
therefore form the tensor-parallel groups (one node, the fastest links, for TP's per-layer collectives) and
pipeline stages are furthest apart (one activation transfer per micro-batch), as torchtitan lays them out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from trainer.strategies.errors import ConfigurationError

ROLES = ("pp", "dp_replicate", "dp_shard", "tp")
Size = Union[int, str]


@dataclass(frozen=True)
class MeshLayout:
    """Resolved sizes of the four parallel dimensions (their product is the world size)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for role in ROLES:
            value = getattr(self, role)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"MeshLayout({role}={value!r}): each size must be a positive int.")

    @property
    def dp(self) -> int:
        """Data-parallel ranks: how many different batches are processed at once."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        """Processes the layout needs."""
        return self.dp * self.tp * self.pp

    def size(self, role: str) -> int:
        """The size of dimension ``role`` (one of ``"pp"``, ``"dp_replicate"``, ``"dp_shard"``, ``"tp"``)."""
        return getattr(self, role)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension (row-major over :data:`ROLES`, as ``init_device_mesh`` lays it)."""
        coords = {}
        for role in reversed(ROLES):
            coords[role] = rank % self.size(role)
            rank //= self.size(role)
        return coords

    def dp_rank(self, rank: int) -> int:
        """Which data-parallel slice of the batch ``rank`` processes (TP and PP peers share one)."""
        coords = self.coordinates(rank)
        return coords["dp_replicate"] * self.dp_shard + coords["dp_shard"]

    @property
    def name(self) -> str:
        """``"dp_shard=4 tp=2"``: the sizes above 1 (``"single"`` for one rank), as the planner's tables show it."""
        return " ".join(f"{role}={self.size(role)}" for role in ("dp_replicate", "dp_shard", "tp", "pp")
                        if self.size(role) > 1) or "single"  # fmt: skip

    def __str__(self) -> str:
        parts = [f"{role}={self.size(role)}" for role in ("dp_replicate", "dp_shard", "tp", "pp") if self.size(role) > 1]
        return " × ".join(parts) or "a single rank"


def check_size(name: str, value: Any) -> Union[int, None]:
    """An int >= 1, or None for "auto"/-1; anything else raises naming ``name``."""
    if value in ("auto", -1):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name}={value!r} must be a positive int, or -1 / 'auto' for what the others leave.")
    return value


def check_sizes(**sizes: Size) -> dict[str, Optional[int]]:
    """Each size valid (see :func:`check_size`) and at most one ``"auto"``; returns them with ``None`` for it."""
    unknown = set(sizes) - set(ROLES)
    if unknown:
        raise ConfigurationError(f"Unknown mesh dimension(s) {sorted(unknown)}; the dimensions are {list(ROLES)}.")
    checked = {name: check_size(name, sizes.get(name, 1)) for name in ("dp_replicate", "dp_shard", "tp", "pp")}
    auto = [name for name, value in checked.items() if value is None]
    if len(auto) > 1:
        raise ConfigurationError(
            f"{' and '.join(f'{n}=auto' for n in auto)}: at most one dimension can be 'auto' (-1); give the others sizes."
        )
    return checked


def resolve_layout(world_size: int, **sizes: Size) -> MeshLayout:
    """Sizes for ``dp_replicate``, ``dp_shard``, ``tp`` and ``pp`` (each an int, or ``-1``/``"auto"`` for at most
    one of them) checked against ``world_size``; the ``"auto"`` one takes what the others leave.

    Raises e.g. ``dp_shard=3 × tp=2 = 6 does not divide the 4 processes`` naming what to change.
    """
    checked = check_sizes(**sizes)
    auto = [name for name, value in checked.items() if value is None]
    fixed = {name: value for name, value in checked.items() if value is not None}
    product = math.prod(fixed.values())
    shown = " × ".join(f"{name}={value}" for name, value in fixed.items() if value > 1) or "1"
    if world_size % product:
        what = f", so {auto[0]}='auto' has no size" if auto else ""
        raise ConfigurationError(
            f"{shown} = {product} does not divide the {world_size} processes{what}. Choose sizes whose product "
            f"divides {world_size}, or change devices/num_nodes."
        )
    if auto:
        fixed[auto[0]] = world_size // product
    elif product != world_size:
        raise ConfigurationError(
            f"{shown} = {product} does not match the {world_size} processes. Make the product of the sizes equal "
            "devices × num_nodes, or set one of them to 'auto'."
        )
    return MeshLayout(**fixed)


def build_device_mesh(layout: MeshLayout, device_type: str, names: dict[str, str]) -> Any:
    """The ``DeviceMesh`` for ``layout`` with the dimensions listed in ``names`` (role → mesh dim name), in
    :data:`ROLES` order; a dimension left out must have size 1."""
    from torch.distributed.device_mesh import init_device_mesh

    roles = [role for role in ROLES if role in names]
    dropped = [role for role in ROLES if role not in names and layout.size(role) > 1]
    if dropped:  # pragma: no cover  (the strategies only drop dimensions they fix to 1)
        raise ConfigurationError(f"The mesh has no dimension for {dropped}.")
    shape = tuple(layout.size(role) for role in roles)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=tuple(names[role] for role in roles))
    # Flattened views of neighbouring data/tensor dims let DTensor reduce over both in one collective (a gradient
    # norm sharded by FSDP and TP) instead of one per dimension; torchtitan does the same.
    for group in (("dp_replicate", "dp_shard"), ("dp_shard", "tp"), ("dp_replicate", "dp_shard", "tp")):
        if all(role in names and layout.size(role) > 1 for role in group) and hasattr(mesh, "_flatten"):
            mesh[tuple(names[role] for role in group)]._flatten("_".join(names[role] for role in group))
    return mesh
