"""The synchronizer's own cost: one sync against a raw torch.distributed replay of the same calls.

:class:`CallRecorder` wraps the data-moving calls of a synchronizer's
:class:`gossip_accel.sync.comm.Communicator` (``allreduce_mean``, ``exchange``, ``broadcast`` and,
where the communicator has them, ``reduce_sum``, ``gather``, ``scatter``) and records what each
moved (sizes, dtypes, peers, tags) without changing it. :func:`measure` then steps the
synchronizer (no training in between) through whole cycles, times every ``sync.step()`` that
communicates, and replays each recorded step as bare ``torch.distributed`` calls on
preallocated buffers of the same sizes to and from the same ranks. Every timed step starts
after a barrier, so neither side waits for a straggler. The ratio sync / raw is what
flattening (gather/scatter of components), averaging, the update rule and bookkeeping add
to the bare exchange of the same bytes on the same links.

The replay is only claimed complete when the recorded calls account for every byte the
synchronizer's counters saw during the step (an algorithm that also moves data another way,
e.g. over RPC, gets ``overhead: null`` and the reason).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from gossip_accel.sync.schedule import event_at

MIN_SYNCS = 4
#: collectives that are the synchronizer's own bookkeeping, not the components' payload: the
#: non-finite flag all-reduce of sync.nonfinite (counted apart, in Synchronizer.health_stats).
#: They stay in the timed sync step and are not replayed, so they count as overhead.
NOT_PAYLOAD = {"nonfinite_flags"}


def _nbytes(t: torch.Tensor) -> tuple[int, torch.dtype]:
    return t.numel(), t.dtype


class CallRecorder:
    """Records the calls a Communicator makes; :meth:`take` returns and clears them."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.calls: list[tuple] = []
        self.bytes_recorded = 0.0  # what the recorded calls added to the counters
        group = getattr(comm, "group", None)

        def glob(r: int) -> int:  # P2P ops and rooted collectives take global ranks
            return r if group is None else dist.get_global_rank(group, r)

        describe: dict[str, Callable[..., tuple]] = {
            "allreduce_mean": lambda name, buffer, wire_dtype=None: (
                "allreduce", *(_nbytes(buffer) if wire_dtype is None else (buffer.numel(), wire_dtype))),
            "broadcast": lambda name, buffer, src=0: ("broadcast", *_nbytes(buffer), glob(src)),
            "reduce_sum": lambda name, buffer, dst=0: ("reduce", *_nbytes(buffer), glob(dst)),
            "gather": lambda name, buffer, gather_list, dst=0: ("gather", *_nbytes(buffer), glob(dst)),
            "scatter": lambda name, buffer, scatter_list, src=0: ("scatter", *_nbytes(buffer), glob(src)),
            "exchange": lambda items: ("exchange", [(it.tag, *_nbytes(it.buffer), [glob(r) for r in it.send_to],
                                                     [glob(r) for r in it.recv_from]) for it in items]),
        }
        self.wrapped = [m for m in describe if callable(getattr(comm, m, None))]
        for method in self.wrapped:
            setattr(comm, method, self._wrap(getattr(comm, method), describe[method]))

    def _wrap(self, original: Callable, describe: Callable) -> Callable:
        def call(*args, **kwargs):
            if args and isinstance(args[0], str) and args[0] in NOT_PAYLOAD:
                return original(*args, **kwargs)
            self.calls.append(describe(*args, **kwargs))
            before = self.comm.stats.total()
            out = original(*args, **kwargs)
            after = self.comm.stats.total()
            self.bytes_recorded += (after.bytes_sent - before.bytes_sent) + (after.bytes_recv - before.bytes_recv)
            return out
        return call

    def take(self) -> list[tuple]:
        calls, self.calls = self.calls, []
        return calls

    def detach(self) -> None:
        for method in self.wrapped:
            self.comm.__dict__.pop(method, None)


class RawReplay:
    """Replays recorded calls with bare torch.distributed ops on reused buffers."""

    def __init__(self, device: torch.device, group=None):
        self.device, self.group = device, group
        self.pool: dict[tuple, torch.Tensor] = {}

    def _buf(self, numel: int, dtype: torch.dtype, slot: int = 0) -> torch.Tensor:
        key = (numel, dtype, slot)
        if key not in self.pool:
            self.pool[key] = torch.zeros(numel, dtype=dtype, device=self.device)
        return self.pool[key]

    def _list(self, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
        return [self._buf(numel, dtype, 100 + k) for k in range(dist.get_world_size(self.group))]

    def run(self, calls: list[tuple]) -> None:
        me = dist.get_rank()
        for kind, *a in calls:
            if kind == "allreduce":
                dist.all_reduce(self._buf(a[0], a[1]), group=self.group)
            elif kind == "broadcast":
                dist.broadcast(self._buf(a[0], a[1]), src=a[2], group=self.group)
            elif kind == "reduce":
                dist.reduce(self._buf(a[0], a[1]), dst=a[2], group=self.group)
            elif kind == "gather":
                dist.gather(self._buf(a[0], a[1]), self._list(a[0], a[1]) if me == a[2] else None, dst=a[2],
                            group=self.group)
            elif kind == "scatter":
                dist.scatter(self._buf(a[0], a[1]), self._list(a[0], a[1]) if me == a[2] else None, src=a[2],
                             group=self.group)
            else:
                ops = []
                for tag, numel, dtype, send_to, recv_from in a[0]:
                    ops += [dist.P2POp(dist.isend, self._buf(numel, dtype), dst, self.group, tag) for dst in send_to]
                    ops += [dist.P2POp(dist.irecv, self._buf(numel, dtype, 1 + j), src, self.group, tag)
                            for j, src in enumerate(recv_from)]
                if ops:
                    for work in dist.batch_isend_irecv(ops):
                        work.wait()


def _barrier_timed(fn: Callable[[], Any]) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _moved(sync: Any) -> float:
    c = sync.comm.stats.total()
    return c.bytes_sent + c.bytes_recv


def measure(sync: Any, device: torch.device) -> Optional[dict]:
    """Mean seconds of a communicating ``sync.step()`` and of its raw replay (slowest rank), and the ratio."""
    if getattr(sync, "comm", None) is None:
        return None
    cfg = sync.cfg
    cycle = max(c.period for c in sync.components)

    def communicates(t: int) -> bool:
        return any(event_at(t, c.period, cfg.warmup_steps, cfg.warmup_period) for c in sync.components)

    per_cycle = sum(communicates(sync.t + k) for k in range(1, cycle + 1))
    steps = cycle * max(1, math.ceil(MIN_SYNCS / max(per_cycle, 1)))
    recorder = CallRecorder(sync.comm)
    sync_times, recorded = [], []
    moved0 = _moved(sync)
    try:
        for _ in range(steps):
            if communicates(sync.t + 1):
                sync_times.append(_barrier_timed(sync.step))
                recorded.append(recorder.take())
            else:
                sync.step()
    finally:
        recorder.detach()
    unrecorded = (_moved(sync) - moved0) - recorder.bytes_recorded
    complete = torch.tensor([float(abs(unrecorded) <= 1e-6 * max(recorder.bytes_recorded, 1.0))])
    dist.all_reduce(complete, op=dist.ReduceOp.MIN)
    out: dict = {"syncs_timed": len(sync_times)}
    if not bool(complete) or not any(recorded):
        out.update({"sync_ms": None, "raw_ms": None, "overhead": None,
                    "why_none": "the synchronizer moved bytes outside the calls the replay knows"})
        return out
    replay = RawReplay(device, getattr(sync.comm, "group", None))
    _barrier_timed(lambda: replay.run(recorded[0]))  # connect and allocate once, untimed
    raw_times = [_barrier_timed(lambda c=calls: replay.run(c)) for calls in recorded]
    totals = torch.tensor([sum(sync_times), sum(raw_times)], dtype=torch.float64)
    dist.all_reduce(totals, op=dist.ReduceOp.MAX)
    n = max(len(sync_times), 1)
    sync_s, raw_s = float(totals[0]) / n, float(totals[1]) / n
    out.update({"sync_ms": sync_s * 1e3, "raw_ms": raw_s * 1e3, "overhead": sync_s / raw_s if raw_s > 0 else None})
    return out
