"""Overlapped syncs of the periodic engine (``sync.overlap_steps = tau``; docs/ALGORITHMS.md).

At a ``sync`` event of step t the component's snapshot theta_t is copied and its exchange is posted
without waiting: an fp32 all-reduce with ``async_op`` on the full graph
(:meth:`~gossip_accel.sync.comm.Communicator.allreduce_start`), the ring's batched ``batch_isend_irecv``
(:meth:`~gossip_accel.sync.comm.Communicator.exchange_start`) for gossip/local. Every handle is
posted and waited for by the training thread in the same order on every rank, so no thread or
stream of our own is needed on gloo. At step t + tau the engine waits, forms the average (the masked
mean of the healthy ranks, or :func:`~gossip_accel.sync.worker.neighbour_mean` on the ring), applies
the rule and merges with the live model (:func:`gossip_accel.sync.overlap.merge_`). With an int8/int4 wire
the ring's messages are coded from the snapshot at t (:meth:`~.coded.CodedExchange.ring_items`) and
decoded into this rank's copies at t + tau (:meth:`~.coded.CodedExchange.ring_received`).

Memory: two fp32 copies of every carried component (the snapshot and the work buffer the average
lands in), allocated once; an int8/int4 ring also holds the coded payloads in flight. A checkpoint
completes the exchanges in flight (waits, applies nothing) and saves the snapshot and what arrived (int8/int4:
the payloads, not yet applied to the copies), so a resumed run applies them at t + tau exactly as the
uninterrupted run does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .. import health
from ..comm import Exchange, PendingExchange
from ..components import Component
from ..schedule import Event
from ..worker import neighbour_mean
from .base import Due, EngineContext


@dataclass(eq=False)  # identity: one per posted exchange
class InFlight:
    """One component's exchange posted at ``apply_at - tau``, applied at ``apply_at``."""

    comp: Component
    event: Event
    apply_at: int
    handle: Any = None  # PendingAllreduce / PendingExchange; None once completed and restored
    recv_from: list[int] = field(default_factory=list)  # ring: the ranks whose copies arrive
    received: list[torch.Tensor] = field(default_factory=list)  # ring: their receive buffers (int8/int4: payloads)
    sick: bool = False  # full graph: this rank's snapshot was sick (it sent zeros)
    healthy: Optional[int] = None  # full graph: the healthy ranks of the verdict (None: no check)


class OverlapQueue:
    """The snapshots, work buffers and exchanges in flight of one worker's carried components."""

    def __init__(self, ctx: EngineContext, recv: dict[str, list[torch.Tensor]], send: dict[str, torch.Tensor],
                 ring: bool):
        self.ctx = ctx
        self.tau = ctx.cfg.overlap_steps
        self.ring = ring
        self.recv, self.send = recv, send  # the periodic engine's ring buffers
        self.snapshot = {c.name: torch.empty_like(c.flat) for c in ctx.carried()}
        self.work = {c.name: torch.empty_like(c.flat) for c in ctx.carried()}
        self.inflight: list[InFlight] = []

    # -- posting at step t --------------------------------------------------------------------
    def post_full(self, comp: Component, ev: Event, verdict: Optional[health.Verdict], j: int) -> None:
        """comp.flat holds theta_t (the verdict gathered it): snapshot it, post the masked all-reduce."""
        ctx = self.ctx
        snap = self.snapshot[comp.name].copy_(comp.flat)
        sick = verdict is not None and verdict.sick[ctx.rank][j]
        work = self.work[comp.name].zero_() if sick else self.work[comp.name].copy_(snap)
        self.inflight.append(InFlight(comp, ev, ctx.t + self.tau, ctx.comm.allreduce_start(comp.name, work),
                                      sick=sick, healthy=verdict.healthy(j) if verdict is not None else None))

    def post_ring(self, due: Due) -> None:
        """Algorithm 1 lines 7-8 posted for all due components in one batched exchange of their snapshots
        (int8/int4: coded from the snapshot now, sender's copies / residual updated now; coded.py)."""
        ctx, coded = self.ctx, self.ctx.coded
        items, posted = [], []
        for comp, ev in due:
            plan = ctx.topology.plan(comp.index, ev.round)
            snap = comp.gather(out=self.snapshot[comp.name])  # theta_t, straight from the live parameters
            recv_from = list(plan.recv_from[ctx.rank])
            if coded is not None:
                its = coded.ring_items(comp, plan.send_to[ctx.rank], recv_from, snap)
            else:
                send = self.send[comp.name].copy_(snap) if comp.name in self.send else snap  # the wire
                its = [Exchange(comp.name, comp.index, send, plan.send_to[ctx.rank], recv_from,
                                self.recv[comp.name][:len(recv_from)])]
            items.extend(its)
            posted.append(InFlight(comp, ev, ctx.t + self.tau, recv_from=recv_from,
                                   received=[buf for it in its for buf in it.recv_buffers]))
        handle = ctx.comm.exchange_start(items)
        for f in posted:
            f.handle = handle
        self.inflight.extend(posted)

    # -- completing at step t + tau -----------------------------------------------------------------
    def due(self, t: Optional[int] = None) -> list[InFlight]:
        """The exchanges to apply at step t (all of them when t is None: the final drain), in post order."""
        out = [f for f in self.inflight if t is None or f.apply_at == t]
        self.inflight = [f for f in self.inflight if f not in out]
        return out

    def complete(self, f: InFlight) -> None:
        """Wait for f's exchange (idempotent)."""
        if f.handle is None:
            return
        if isinstance(f.handle, PendingExchange):
            self.ctx.comm.exchange_finish(f.handle)
        else:
            self.ctx.comm.allreduce_finish(f.handle)
        f.handle = None

    def average(self, f: InFlight) -> tuple[torch.Tensor, str, bool]:
        """(avg_t in the work buffer, the rule to apply, reset?) once f's exchange has arrived."""
        ctx, comp = self.ctx, f.comp
        self.complete(f)
        work, snap = self.work[comp.name], self.snapshot[comp.name]
        if not self.ring or f.event.kind != "sync":
            return work, ctx.masked_result(comp, work, f.event.kind, f.sick, f.healthy), f.sick
        received = f.received if ctx.coded is None else ctx.coded.ring_received(comp, f.recv_from, f.received)
        bar = work  # <- the mean of the snapshot and the received copies
        dropped, source = neighbour_mean(ctx.cfg.nonfinite, ctx.rank, ctx.t, comp.name, bar, received, f.recv_from,
                                         health.slots_sick(ctx.slots.get(comp.name)), own=snap)
        ctx.metrics.nonfinite_dropped += dropped
        if source is not None:
            ctx.record_reset(comp, source)
        return bar, "sync" if source is None else "warmup_end", source is not None

    # -- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The exchanges in flight, completed (not applied): snapshot and what arrived, per component."""
        out = {}
        for f in self.inflight:
            self.complete(f)
            name = f.comp.name
            entry = {"apply_at": f.apply_at, "kind": f.event.kind, "round": f.event.round, "sick": f.sick,
                     "healthy": f.healthy, "recv_from": list(f.recv_from),
                     "snapshot": self.snapshot[name].cpu().clone()}
            if self.ring:  # the arrived copies (int8/int4: payloads, applied to this rank's copies at apply_at)
                entry["recv"] = [r.cpu().clone() for r in f.received]
            else:
                entry["work"] = self.work[name].cpu().clone()
            out[name] = entry
        return out

    def load_state_dict(self, state: dict) -> None:
        by_name = {c.name: c for c in self.ctx.carried()}
        self.inflight = []
        for name, e in state.items():
            comp = by_name[name]
            self.snapshot[name].copy_(e["snapshot"])
            received = []
            if self.ring and self.ctx.coded is not None:
                received = [r.to(comp.flat.device) for r in e["recv"]]
            elif self.ring:
                received = [buf.copy_(r) for buf, r in zip(self.recv[name], e["recv"])]
            else:
                self.work[name].copy_(e["work"])
            self.inflight.append(InFlight(comp, Event(e["kind"], int(e["round"])), int(e["apply_at"]),
                                          recv_from=list(e["recv_from"]), received=received, sick=bool(e["sick"]),
                                          healthy=e["healthy"]))
        self.inflight.sort(key=lambda f: (f.apply_at, f.comp.index))
