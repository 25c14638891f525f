"""The trainer's own collectives (not the synchronizer's): each under :func:`gossip_accel.sync.faults.guard`,
so that a hung or dead peer ends them with an error naming the collective and the ranks, and none
counted in the sync traffic. Without an initialised process group (or with one worker) each is a
local no-op."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ..sync.faults import guard


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def agree_on_steps(local_steps: int) -> int:
    """The number of steps every rank takes this epoch: the minimum over ranks.

    One all-reduce per epoch: ranks with more batches leave the surplus out, so no rank waits
    forever in a sync round (gossip rounds are collective).
    """
    world = world_size()
    if world == 1:
        return local_steps
    t = torch.tensor([local_steps], dtype=torch.long)
    with guard("all-reduce", "steps per epoch", range(world)):
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def all_mean(values: Sequence[float]) -> list[float]:
    """Mean over workers of a few scalars (every rank gets the same numbers)."""
    t = torch.tensor(list(values), dtype=torch.float64)
    world = world_size()
    if world > 1:
        with guard("all-reduce", "epoch statistics", range(world)):
            dist.all_reduce(t)
        t /= world
    return t.tolist()


def barrier(what: str) -> None:
    world = world_size()
    if world > 1:
        with guard("barrier", what, range(world)):
            dist.barrier()


@torch.no_grad()
def average_of_replicas(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose floating-point parameters and buffers are the mean over all
    workers, (1/n) sum_k theta^k (what the final average of Algorithm 1, line 20, would give
    now). ``model`` itself is not touched; one all-reduce of its state in its own dtype."""
    import copy

    avg = copy.deepcopy(model)
    world = world_size()
    if world == 1:
        return avg
    groups: dict[tuple, list[torch.Tensor]] = {}  # one flat all-reduce per dtype and device
    for t in avg.state_dict().values():
        if t.is_floating_point():
            groups.setdefault((t.dtype, t.device), []).append(t)
    for tensors in groups.values():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        with guard("all-reduce", "the replicas' average (validation)", range(world)):
            dist.all_reduce(flat)
        flat /= world
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
    return avg
