"""The collectives the loop and validation share: gathering to rank 0, broadcasting from it,
and where each rank runs (placement). A world of one needs no process group."""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = [
    "broadcast_from_rank0",
    "gather_objects",
    "gather_placement",
    "gather_to_rank0",
    "placement_fields",
]


def gather_to_rank0(payload: Any, rank: int, world_size: int) -> list[Any] | None:
    """Every rank's ``payload``, in rank order, on rank 0 (None elsewhere)."""
    if world_size == 1:
        return [payload]
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    # note: a collective (pickled objects, a CPU-GPU sync), once per window, only when needed
    dist.gather_object(payload, gathered, dst=0)
    return gathered


def broadcast_from_rank0(values: list[Any], world_size: int) -> list[Any]:
    """Rank 0's ``values`` on every rank, in place (a list of picklable objects)."""
    if world_size > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(values, src=0)
    return values


def gather_objects(value: Any, world_size: int) -> list[Any]:
    """Every rank's ``value``, in rank order (a collective: every rank calls it)."""
    if world_size == 1:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, value)
    return out


def gather_placement(node_id: str, node: str, world_size: int) -> list[tuple[str, str, int]]:
    """(node id, node IP, pid) of every rank, in rank order: once, at start-up. Ranks on one
    node are told apart from other nodes by Ray's node id, never by the hostname (raylets of
    one machine, and containers on some clusters, share one); outside Ray both fall back to
    the hostname."""
    me = (node_id or socket.gethostname(), node or socket.gethostname(), os.getpid())
    if world_size == 1:
        return [me]
    import torch.distributed as dist

    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, me)
    return [tuple(e) for e in everyone]


def placement_fields(placement: list[tuple[str, str, int]]) -> dict[str, Any]:
    """The manifest's record of where each rank ran."""
    return {
        "rank_nodes": " ".join(f"{rank}={ip}" for rank, (_, ip, _) in enumerate(placement)),
        "nodes_used": len({node for node, _, _ in placement}),
    }
