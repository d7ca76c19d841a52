"""The collectives a step issues: kind, the mesh dimension they run over, bytes, recorded by a dispatch mode that
sees what ``CommDebugMode`` sees (the c10d and functional collectives, after DTensor turned its ops into them).
``CommDebugMode`` itself counts but keeps no sizes, and its module tracker breaks on FSDP's redirected forward."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from torch.utils._python_dispatch import TorchDispatchMode

_KINDS = {
    "allgather_": "all_gather", "_allgather_base_": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_out": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "allreduce_": "all_reduce", "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast", "broadcast": "broadcast",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "shard_dim_alltoall": "all_to_all", "send": "send", "recv_": "recv", "isend": "send", "irecv": "recv",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of the step: ``op`` (``all_gather``, ``reduce_scatter``, ``all_reduce``, ``send``, ...), the
    mesh dimension (or ``"world"``) whose group it ran on, the bytes of the tensor it moved (this rank's buffer:
    the gathered output, the scattered input, the reduced tensor), and the size of that group."""

    op: str
    mesh_dim: str
    bytes: int
    group_size: int

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"op": self.op, "mesh_dim": self.mesh_dim, "bytes": self.bytes, "group_size": self.group_size}


def group_names(mesh: Any) -> dict[str, str]:
    """``{process group name: mesh dimension name}`` for every dimension of ``mesh`` (and its flattened ones)."""
    import torch.distributed as dist

    names: dict[str, str] = {}
    if mesh is not None:
        root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
        for candidate in {id(m): m for m in (mesh, root)}.values():
            for dim in candidate.mesh_dim_names or ():
                names.setdefault(candidate.get_group(dim).group_name, dim)
        for dim, sub in dict(getattr(root, "_flatten_mapping", None) or {}).items():
            names.setdefault(sub.get_group().group_name, dim)
    if dist.is_initialized():  # a 1-D mesh over every rank uses the default group: it keeps the mesh's name
        names.setdefault(dist.distributed_c10d._get_default_group().group_name, "world")
    return names


class CollectiveLog(TorchDispatchMode):
    """Keeps each collective's kind, group and bytes (:attr:`collectives`) while active.

    ``mesh``: the strategy's ``DeviceMesh``, to name each group by its dimension; other groups are named by their
    ranks."""

    def __init__(self, mesh: Any = None) -> None:
        super().__init__()
        self._names = group_names(mesh)
        self.collectives: list[Collective] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Optional[dict] = None) -> Any:
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor turn its op into local ops and collectives, seen next
        out = func(*args, **(kwargs or {}))
        kind = _KINDS.get(getattr(getattr(func, "_overloadpacket", None), "__name__", ""))
        if kind is not None:
            self.collectives.append(self._record(kind, func, out, args, kwargs or {}))
        return out

    def _record(self, kind: str, func: Any, out: Any, args: Any, kwargs: dict) -> Collective:
        import torch.distributed as dist
        from torch.distributed._tools.fake_collectives import CollectiveOp

        group = CollectiveOp.get_process_group(func, args)
        size = CollectiveOp.get_comm_tensor_size(func, out, args, kwargs)
        name = self._names.get(group.group_name)
        if name is None:
            name = "ranks " + ",".join(map(str, dist.get_process_group_ranks(group)))
        return Collective(kind, name, int(size), group.size())


def summarise(collectives: list[Collective]) -> list[dict[str, Any]]:
    """One row per (op, mesh dimension): how many, and their bytes in total, in first-seen order."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in collectives:
        row = rows.setdefault((c.op, c.mesh_dim), {"op": c.op, "mesh_dim": c.mesh_dim, "count": 0, "bytes": 0,
                                                   "group_size": c.group_size})  # fmt: skip
        row["count"] += 1
        row["bytes"] += c.bytes
    return list(rows.values())
