"""The transport: all-reduce mean and neighbour exchange of flat buffers, with counters.

This module knows nothing about algorithms. It moves contiguous buffers (one per component)
with torch.distributed and counts, per component, the bytes sent and received and the
seconds spent. Byte accounting:

* ``allreduce_mean`` counts what a ring all-reduce (the algorithm NCCL and gloo use for
  large buffers) transmits per worker: 2 (n-1)/n * nbytes sent and the same received. With a
  bf16/fp16 wire (``sync.exchange_dtype``) nbytes are the wire's: half of fp32's.
* ``allreduce_mean_coded`` (int8/int4 wire) counts its real payloads, codes + scales: 2 (n-1)
  chunk payloads of :mod:`~gossip_accel.sync.quantize` sent and received.
* ``exchange`` counts the exact payload of every ``isend`` / ``irecv``.
* ``reduce_sum`` / ``gather`` (to one rank) and ``scatter`` / ``broadcast`` (from one rank), the
  collectives of the parameter-server algorithms in lock-step mode, count the direct model:
  the root sends or receives (n-1) * nbytes, every other rank nbytes.
* :meth:`CommStats.add` takes the bytes of RPC traffic (ASGD, EASGD, ADPSGD in asynchronous
  mode), which RPC threads of the server or of a passive ADPSGD worker report concurrently
  with the training thread: the counters are guarded by a lock.
"""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .faults import guard


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
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, sent: float, recv: float, seconds: float, call: bool = True) -> None:
        """Count one operation of component ``name`` (thread-safe); ``call=False`` adds to the
        last one (the wait of an exchange whose bytes were counted when it was posted)."""
        with self.lock:
            c = self.per_component[name]
            c.add(sent, recv, seconds)
            if not call:
                c.calls -= 1

    def total(self) -> Counter:
        out = Counter()
        with self.lock:
            for c in self.per_component.values():
                out.bytes_sent += c.bytes_sent
                out.bytes_recv += c.bytes_recv
                out.seconds += c.seconds
                out.calls += c.calls
        return out

    def snapshot(self) -> dict[str, Counter]:
        """A consistent copy of the per-component counters."""
        with self.lock:
            return {k: Counter(**vars(v)) for k, v in self.per_component.items()}

    def state_dict(self) -> dict:
        with self.lock:
            return {k: vars(v).copy() for k, v in self.per_component.items()}

    def load_state_dict(self, state: dict) -> None:
        with self.lock:
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
        self._wire_buffers: dict = {}  # (name, wire dtype, padded numel) -> buffers of _allreduce_mean_wire

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

    def _all(self) -> list[int]:
        """The global ranks of the group (the peers of a collective, for timeout errors)."""
        return [self._global(r) for r in range(self.world_size)]

    def allreduce_mean(self, name: str, buffer: torch.Tensor, wire_dtype: Optional[torch.dtype] = None) -> None:
        """buffer <- mean over the group's ranks (in place).

        With a ``wire_dtype`` other than the buffer's (``sync.exchange_dtype``) the mean travels in
        that dtype: :meth:`_allreduce_mean_wire`.
        """
        if wire_dtype is not None and wire_dtype != buffer.dtype and self.world_size > 1:
            return self._allreduce_mean_wire(name, buffer, wire_dtype)
        start = time.perf_counter()
        with guard("all-reduce", name, self._all(), self.group):
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
        buffer.div_(self.world_size)
        moved = ring_allreduce_bytes(buffer.numel() * buffer.element_size(), self.world_size)
        self.stats.add(name, moved, moved, time.perf_counter() - start)

    def allreduce_start(self, name: str, buffer: torch.Tensor) -> "PendingAllreduce":
        """Post the fp32 sum all-reduce of :meth:`allreduce_mean` and return without waiting
        (``sync.overlap_steps``); ``buffer`` stays untouched until :meth:`allreduce_finish`."""
        start = time.perf_counter()
        with guard("all-reduce", name, self._all(), self.group):
            work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return _posted(PendingAllreduce(name, buffer, work, time.perf_counter() - start, self.stats))

    def allreduce_finish(self, pending: "PendingAllreduce") -> None:
        """Wait for :meth:`allreduce_start`'s all-reduce: buffer <- the mean; counted once, where it was posted."""
        if pending.done:
            return
        start = time.perf_counter()
        with guard("all-reduce", pending.name, self._all(), self.group):
            pending.work.wait()
        _waited(pending)
        pending.buffer.div_(self.world_size)
        moved = ring_allreduce_bytes(pending.buffer.numel() * pending.buffer.element_size(), self.world_size)
        pending.stats.add(pending.name, moved, moved, pending.post_seconds + time.perf_counter() - start)

    def _allreduce_mean_wire(self, name: str, buffer: torch.Tensor, dtype: torch.dtype) -> None:
        """buffer <- r(sum_k r(buffer^k) / n): the mean over the group with a bf16/fp16 wire.

        A reduce-scatter (``all_to_all_single``: rank j receives chunk j of every rank, in the wire
        dtype) whose chunk owner sums the n copies in fp32 in rank order
        (:func:`~gossip_accel.sync.precision.wire_sum_mean`), then an all-gather of the rounded means.
        Two roundings per element, none of them inside the sum (a bf16 ``all_reduce`` would round
        every partial sum, in an order that depends on gloo's algorithm), and the same bytes as a
        ring all-reduce of the wire dtype: 2 (n-1) chunks sent and received per rank, chunk =
        ceil(numel / n) elements (the buffer is zero-padded to n chunks).
        """
        from .precision import wire_sum_mean

        start = time.perf_counter()
        n, numel = self.world_size, buffer.numel()
        chunk = -(-numel // n)
        key = (name, dtype, n * chunk)
        if key not in self._wire_buffers:  # allocated at the first sync of the component, then reused
            self._wire_buffers[key] = (torch.zeros(n * chunk, dtype=dtype, device=buffer.device),
                                       torch.empty(n * chunk, dtype=dtype, device=buffer.device),
                                       torch.empty(chunk, dtype=torch.float32, device=buffer.device),
                                       torch.empty(chunk, dtype=dtype, device=buffer.device))
        send, recv, mean, mean_wire = self._wire_buffers[key]
        send[:numel].copy_(buffer.reshape(-1))
        send[numel:].zero_()
        with guard("all-reduce", name, self._all(), self.group):
            dist.all_to_all_single(recv, send, group=self.group)
            wire_sum_mean(list(recv.view(n, chunk).unbind(0)), mean)
            dist.all_gather(list(send.view(n, chunk).unbind(0)), mean_wire.copy_(mean), group=self.group)
        buffer.reshape(-1).copy_(send[:numel])
        moved = 2.0 * (n - 1) * chunk * send.element_size()
        self.stats.add(name, moved, moved, time.perf_counter() - start)

    def allreduce_mean_coded(self, name: str, delta: torch.Tensor, codec, residual: torch.Tensor,
                             owner_residual: torch.Tensor, sick: bool = False) -> None:
        """delta <- the mean over the group of the ranks' int8/int4-coded ``delta`` (an outer gradient), in place.

        A quantized reduce-scatter (``all_to_all_single`` of the uint8 payloads of
        :func:`~gossip_accel.sync.quantize.coded_send`: chunk j of Q(delta_i + e_i) to rank j), the chunk
        owner's fp32 sum in rank order re-quantized with its own error feedback
        (:func:`~gossip_accel.sync.quantize.owner_reduce_`), and an ``all_gather`` of the owners' payloads
        that every rank decodes alike. gloo has no int8 reduction; summing decoded payloads is exact and
        deterministic. Bytes: 2 (n - 1) chunk payloads (codes + scales) sent and received per rank.
        """
        from .quantize import chunk_length, coded_send, gathered_mean, owner_reduce_

        start = time.perf_counter()
        n, numel = self.world_size, delta.numel()
        chunk = chunk_length(numel, n)
        send = coded_send(codec, delta, residual, n, sick)
        recv = torch.empty_like(send)
        gathered = torch.empty_like(send)
        with guard("all-reduce", name, self._all(), self.group):
            dist.all_to_all_single(recv, send, group=self.group)
            mine = owner_reduce_(codec, list(recv.split(1)), chunk, owner_residual)
            dist.all_gather(list(gathered.split(1)), mine, group=self.group)
        delta.reshape(-1).copy_(gathered_mean(codec, gathered, chunk, numel))
        moved = 2.0 * (n - 1) * send.shape[1]
        self.stats.add(name, moved, moved, time.perf_counter() - start)

    def broadcast(self, name: str, buffer: torch.Tensor, src: int = 0) -> None:
        """buffer <- rank ``src``'s buffer (group rank)."""
        start = time.perf_counter()
        with guard("broadcast", name, [self._global(src)], self.group):
            dist.broadcast(buffer, src=self._global(src), group=self.group)
        nbytes = buffer.numel() * buffer.element_size()
        sent = nbytes * (self.world_size - 1) if self.rank == src else 0
        self.stats.add(name, sent, 0 if self.rank == src else nbytes, time.perf_counter() - start)

    def reduce_sum(self, name: str, buffer: torch.Tensor, dst: int = 0) -> None:
        """buffer on rank ``dst`` <- sum over the group's ranks (other ranks' buffers are scratch)."""
        start = time.perf_counter()
        with guard("reduce", name, self._all(), self.group):
            dist.reduce(buffer, dst=self._global(dst), op=dist.ReduceOp.SUM, group=self.group)
        nbytes = buffer.numel() * buffer.element_size()
        root = self.rank == dst
        self.stats.add(name, 0 if root else nbytes, nbytes * (self.world_size - 1) if root else 0,
                       time.perf_counter() - start)

    def gather(self, name: str, buffer: torch.Tensor, gather_list: Optional[list[torch.Tensor]], dst: int = 0) -> None:
        """Rank ``dst`` receives every rank's ``buffer`` in ``gather_list`` (in group-rank order)."""
        start = time.perf_counter()
        root = self.rank == dst
        with guard("gather", name, self._all() if root else [self._global(dst)], self.group):
            dist.gather(buffer, gather_list if root else None, dst=self._global(dst), group=self.group)
        nbytes = buffer.numel() * buffer.element_size()
        self.stats.add(name, 0 if root else nbytes, nbytes * (self.world_size - 1) if root else 0,
                       time.perf_counter() - start)

    def scatter(self, name: str, buffer: torch.Tensor, scatter_list: Optional[list[torch.Tensor]], src: int = 0) -> None:
        """Every rank k receives ``scatter_list[k]`` of rank ``src`` into ``buffer``."""
        start = time.perf_counter()
        root = self.rank == src
        with guard("scatter", name, self._all() if root else [self._global(src)], self.group):
            dist.scatter(buffer, scatter_list if root else None, src=self._global(src), group=self.group)
        nbytes = buffer.numel() * buffer.element_size()
        self.stats.add(name, nbytes * (self.world_size - 1) if root else 0, 0 if root else nbytes,
                       time.perf_counter() - start)

    def exchange(self, items: Sequence[Exchange]) -> None:
        """Send each buffer to its ``send_to`` ranks and receive its ``recv_from`` copies.

        All components of the round go into one ``batch_isend_irecv`` (tags keep them apart),
        so a round costs one latency, not one per component.
        """
        self.exchange_finish(self.exchange_start(items))

    def exchange_start(self, items: Sequence[Exchange]) -> "PendingExchange":
        """Post the sends and receives of :meth:`exchange` and return without waiting.

        The buffers must stay untouched until :meth:`exchange_finish` (delay-by-one ADPSGD
        computes the next local step meanwhile).
        """
        ops = []
        for it in items:
            for dst in it.send_to:
                ops.append(dist.P2POp(dist.isend, it.buffer, self._global(dst), self.group, it.tag))
            for src, rbuf in zip(it.recv_from, it.recv_buffers):
                ops.append(dist.P2POp(dist.irecv, rbuf, self._global(src), self.group, it.tag))
        start = time.perf_counter()
        with guard("exchange", _names(items), _peers(items, self._global), self.group):
            works = dist.batch_isend_irecv(ops) if ops else []
        return _posted(PendingExchange(list(items), works, time.perf_counter() - start, stats=self.stats))

    def exchange_finish(self, pending: "PendingExchange") -> None:
        """Wait for an exchange posted by :meth:`exchange_start` and count its traffic (once)."""
        if pending.done:
            return
        start = time.perf_counter()
        with guard("exchange", _names(pending.items), _peers(pending.items, self._global), self.group):
            for work in pending.works:
                work.wait()
        _waited(pending)
        items = pending.items
        if not pending.works:
            return
        seconds = pending.post_seconds + time.perf_counter() - start
        stats = pending.stats if pending.stats is not None else self.stats  # where it was posted
        total = sum((len(it.send_to) + len(it.recv_from)) * it.buffer.numel() for it in items) or 1
        for it in items:
            nbytes = it.buffer.numel() * it.buffer.element_size()
            share = (len(it.send_to) + len(it.recv_from)) * it.buffer.numel() / total
            stats.add(it.name, len(it.send_to) * nbytes, len(it.recv_from) * nbytes, seconds * share)


def _names(items: Sequence[Exchange]) -> str:
    return ", ".join(it.name for it in items)


def _peers(items: Sequence[Exchange], to_global) -> list[int]:
    return sorted({to_global(r) for it in items for r in (*it.send_to, *it.recv_from)})


@dataclass
class PendingExchange:
    """Sends and receives posted by :meth:`Communicator.exchange_start`, not yet waited for.

    Their traffic is counted, when they complete, in the counters that were active when they
    were posted (a delay-by-one exchange completed by ``finalize`` is per-step traffic).
    """

    items: list
    works: list
    post_seconds: float = 0.0
    done: bool = False
    stats: Optional[CommStats] = None


@dataclass
class PendingAllreduce:
    """An all-reduce posted by :meth:`Communicator.allreduce_start`, not yet waited for."""

    name: str
    buffer: torch.Tensor
    work: object
    post_seconds: float = 0.0
    stats: Optional[CommStats] = None
    done: bool = False


#: exchanges and all-reduces posted (``*_start``) and not yet waited for (``*_finish``), in this process,
#: by id: held until waited for, so that :func:`drain_in_flight` finds those of a dropped Synchronizer
_IN_FLIGHT: dict[int, "PendingExchange | PendingAllreduce"] = {}
_IN_FLIGHT_LOCK = threading.Lock()


def _posted(pending):
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT[id(pending)] = pending
    return pending


def _waited(pending) -> None:
    pending.done = True
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.pop(id(pending), None)


def drain_in_flight() -> list[str]:
    """Wait for every exchange posted in this process and never waited for; returns their
    component names (empty: nothing was in flight).

    A ``Synchronizer`` with ``sync.overlap_steps`` > 0 that is closed after an error or dropped
    without :meth:`~gossip_accel.sync.synchronizer.Synchronizer.finalize` leaves its last posted
    exchanges in gloo; destroying the process group under them can hang or abort.
    :func:`gossip_accel.shutdown` calls this first (every rank posted the same exchanges, so each
    completes). Nothing is applied to any model and nothing is counted: the traffic of an exchange
    whose result is thrown away is not a sync.
    """
    with _IN_FLIGHT_LOCK:
        pending = list(_IN_FLIGHT.values())
    names: list[str] = []
    for p in pending:
        if isinstance(p, PendingAllreduce):
            p.work.wait()
            names.append(p.name)
        else:
            for work in p.works:
                work.wait()
            names.extend(it.name for it in p.items)
        _waited(p)
    return names


#: the names Linux gives the threads of a gloo process group (ProcessGroupGloo's work threads)
GLOO_WORKER_THREAD = "pt_gloo_runloop"


def _gloo_worker_states() -> Optional[list[str]]:
    """The scheduler state (R, S, D, ...) of each gloo work thread of this process; None where
    ``/proc/self/task`` cannot be read (not Linux)."""
    tasks = "/proc/self/task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return None
    states = []
    for tid in tids:
        try:
            with open(f"{tasks}/{tid}/comm") as f:
                if f.read().strip() != GLOO_WORKER_THREAD:
                    continue
            with open(f"{tasks}/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:  # the thread ended meanwhile
            continue
    return states


def wait_for_idle_gloo_workers(timeout: float = 5.0, settle: int = 5, interval: float = 0.01) -> bool:
    """Sleep until every gloo work thread of this process is asleep ``settle`` samples in a row.

    ``destroy_process_group`` leaves a process group's C++ work threads running while anything
    (a DDP model, the synchronizer) still holds the group: they end when the group is freed,
    which is during interpreter finalization. A work thread that was descheduled right after a
    collective completed still holds that collective's tensors; when it drops them after the
    interpreter began finalizing, freeing a tensor whose Python object outlived Python's own
    reference takes the GIL, Python ends the thread (``pthread_exit``) and the unwinding through
    a ``noexcept`` destructor calls ``std::terminate``: "terminate called without an active
    exception", SIGABRT, seen in about 1 of 45 4-worker runs on a loaded machine (bench/exit_loop.py).
    Called after the last collective (:func:`gossip_accel.shutdown`), with the GIL released by
    ``time.sleep``, this lets those threads drop what they hold while Python is still whole.
    Returns False on timeout or where the threads cannot be seen (not Linux).
    """
    deadline, quiet = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        states = _gloo_worker_states()
        if states is None:
            return False
        quiet = quiet + 1 if all(s == "S" for s in states) else 0
        if quiet >= settle:
            return True
        time.sleep(interval)
    return False
