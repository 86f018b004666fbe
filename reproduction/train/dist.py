"""The only module that calls torch.distributed: process group life, rank predicates, collectives.

Model, data and loop code ask here ("am I rank 0?", "average these metrics") and never touch
`torch.distributed` themselves, so rank behaviour is testable with a one-process gloo group.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

_DEVICE: torch.device = torch.device("cpu")  # where collective tensors live (cuda/npu for nccl/hccl)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the driver picks MASTER_PORT with this)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init(
    *,
    backend: str,
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout_s: float,
    device: torch.device,
) -> None:
    """Join the process group; every rank blocks here until all joined (or `timeout_s` passes)."""
    global _DEVICE
    _DEVICE = device
    tdist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def destroy(*, clean: bool = True) -> None:
    """Leave the group. After a clean run the barrier first is not optional: without it a gloo rank
    aborted ("terminate called without an active exception") in 4 of 12 runs here (PLATFORM.md).
    After a failure (`clean=False`) peers may be gone, so no barrier: leave at once."""
    if tdist.is_available() and tdist.is_initialized():
        try:
            if clean:
                tdist.barrier()
        finally:
            tdist.destroy_process_group()


def rank() -> int:
    return tdist.get_rank() if tdist.is_initialized() else 0


def world_size() -> int:
    return tdist.get_world_size() if tdist.is_initialized() else 1


def is_main() -> bool:
    """True on the rank that writes shared files (logs, manifests, exports)."""
    return rank() == 0


def barrier() -> None:
    if tdist.is_initialized():
        tdist.barrier()


def mesh(device_kind: str):
    """A 1-D device mesh over all ranks, for FSDP2."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_kind, (world_size(),))


def mean_dict(values: dict[str, float]) -> dict[str, float]:
    """Average a {name: float} dict over ranks (every rank must pass the same keys)."""
    if not values or world_size() == 1:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=_DEVICE)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return {k: float(v) / world_size() for k, v in zip(keys, t.tolist())}


def all_gather_array(array: np.ndarray) -> np.ndarray:
    """Concatenate per-rank numpy arrays along axis 0 in rank order; every rank gets the result."""
    return np.concatenate(all_gather_object(np.asarray(array)), axis=0)


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, in rank order, on every rank."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    tdist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (so all ranks act on one decision)."""
    if world_size() == 1:
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0)
    return box[0]
