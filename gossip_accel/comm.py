"""The transport: all-reduce mean and neighbour exchange of flat buffers, with counters.

This module knows nothing about algorithms. It moves contiguous buffers (one per component)
with torch.distributed and counts, per component, the bytes sent and received and the
seconds spent. Byte accounting:

* ``allreduce_mean`` counts what a ring all-reduce (the algorithm NCCL and gloo use for
  large buffers) transmits per worker: 2 (n-1)/n * nbytes sent and the same received.
* ``exchange`` counts the exact payload of every ``isend`` / ``irecv``.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.distributed as dist


@dataclass
class Counter:
    """Traffic of one component (or of the DDP baseline)."""

    bytes_sent: float = 0.0
    bytes_recv: float = 0.0
    seconds: float = 0.0
    calls: int = 0

    def add(self, sent: float, recv: float, seconds: float) -> None:
        self.bytes_sent += sent
        self.bytes_recv += recv
        self.seconds += seconds
        self.calls += 1


@dataclass
class CommStats:
    """Counters per component name; ``total()`` sums them."""

    per_component: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))

    def total(self) -> Counter:
        out = Counter()
        for c in self.per_component.values():
            out.bytes_sent += c.bytes_sent
            out.bytes_recv += c.bytes_recv
            out.seconds += c.seconds
            out.calls += c.calls
        return out

    def state_dict(self) -> dict:
        return {k: vars(v).copy() for k, v in self.per_component.items()}

    def load_state_dict(self, state: dict) -> None:
        self.per_component.clear()
        for k, v in state.items():
            self.per_component[k] = Counter(**v)


def ring_allreduce_bytes(nbytes: int, n: int) -> float:
    """Bytes one worker sends (and receives) in a ring all-reduce of ``nbytes``: 2(n-1)/n * nbytes."""
    return 2.0 * (n - 1) / n * nbytes if n > 1 else 0.0


@dataclass
class Exchange:
    """One component's part of a neighbour exchange round."""

    name: str
    tag: int
    buffer: torch.Tensor  # this rank's copy (sent as is)
    send_to: Sequence[int]
    recv_from: Sequence[int]
    recv_buffers: Sequence[torch.Tensor]  # filled in the order of recv_from


class Communicator:
    """torch.distributed transport for one process group."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.stats = CommStats()

    @contextmanager
    def accounting(self, stats: CommStats):
        """Count the traffic of the enclosed calls in ``stats`` instead of ``self.stats``."""
        saved, self.stats = self.stats, stats
        try:
            yield stats
        finally:
            self.stats = saved

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def allreduce_mean(self, name: str, buffer: torch.Tensor) -> None:
        """buffer <- mean over the group's ranks (in place)."""
        start = time.perf_counter()
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
        buffer.div_(self.world_size)
        moved = ring_allreduce_bytes(buffer.numel() * buffer.element_size(), self.world_size)
        self.stats.per_component[name].add(moved, moved, time.perf_counter() - start)

    def broadcast(self, name: str, buffer: torch.Tensor, src: int = 0) -> None:
        """buffer <- rank ``src``'s buffer (group rank)."""
        start = time.perf_counter()
        dist.broadcast(buffer, src=self._global(src), group=self.group)
        nbytes = buffer.numel() * buffer.element_size()
        sent = nbytes * (self.world_size - 1) if self.rank == src else 0
        self.stats.per_component[name].add(sent, 0 if self.rank == src else nbytes, time.perf_counter() - start)

    def exchange(self, items: Sequence[Exchange]) -> None:
        """Send each buffer to its ``send_to`` ranks and receive its ``recv_from`` copies.

        All components of the round go into one ``batch_isend_irecv`` (tags keep them apart),
        so a round costs one latency, not one per component.
        """
        ops = []
        for it in items:
            for dst in it.send_to:
                ops.append(dist.P2POp(dist.isend, it.buffer, self._global(dst), self.group, it.tag))
            for src, rbuf in zip(it.recv_from, it.recv_buffers):
                ops.append(dist.P2POp(dist.irecv, rbuf, self._global(src), self.group, it.tag))
        if not ops:
            return
        start = time.perf_counter()
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        seconds = time.perf_counter() - start
        total = sum((len(it.send_to) + len(it.recv_from)) * it.buffer.numel() for it in items) or 1
        for it in items:
            nbytes = it.buffer.numel() * it.buffer.element_size()
            share = (len(it.send_to) + len(it.recv_from)) * it.buffer.numel() / total
            self.stats.per_component[it.name].add(
                len(it.send_to) * nbytes, len(it.recv_from) * nbytes, seconds * share
            )
