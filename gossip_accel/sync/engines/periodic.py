"""Algorithm 1 of 000_07fa007f7f1023ae.txt for one worker: MA, BMUF, local-MA/BMUF, gossip-MA/BMUF
(registry family ``periodic``).

Every component that is due is averaged (line 8): over all workers with one (masked) all-reduce
on the full graph and for the warm-up averages, or with the node's q ring neighbours (Definition 1)
in one batched exchange for the local/gossip variants; then the update rule of ``sync.algorithm``
(:func:`~gossip_accel.sync.algorithms.new_local_model`: lines 9-16) writes the new local model.
One flag all-reduce per step covers the full-graph components and the buffers (health.py).
With ``sync.overlap_steps`` = tau > 0 a ``sync`` event is posted instead and applied tau steps later
(:mod:`.overlap`; on the ring also with an int8/int4 wire); warm-up averages stay blocking.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import health
from ..algorithms import new_local_model
from ..comm import Exchange
from ..components import Component
from ..config import ConfigError
from ..overlap import merge_component_
from ..precision import is_low
from ..quantize import codec_of
from ..schedule import event_at
from ..topology import RingTopology
from ..worker import neighbour_mean, relative_distance
from .base import Due, Engine, EngineContext
from .coded import CodedExchange
from .overlap import InFlight, OverlapQueue


class PeriodicEngine(Engine):
    """Owns the receive buffers of the ring, the wire-dtype send copies and the staging buffers of
    CPU-held BMUF slots; the slots themselves are the context's (``ctx.slots``)."""

    def __init__(self, ctx: EngineContext):
        super().__init__(ctx)
        self.gossip = isinstance(ctx.topology, RingTopology)
        self.staging: dict[str, torch.Tensor] = {}  # slots on another device than the component
        self.recv: dict[str, list[torch.Tensor]] = {}
        self.send: dict[str, torch.Tensor] = {}  # ring: the wire-dtype copy a node sends
        codec = codec_of(ctx.cfg)  # sync.exchange_dtype int8 / int4: references and residuals (coded.py)
        for comp in ctx.carried():
            slots = ctx.slots.get(comp.name)
            if slots is not None and slots.device != comp.flat.device:
                self.staging[comp.name] = torch.empty_like(comp.flat, device=slots.device)
            if self.gossip and codec is None:
                self.recv[comp.name] = [torch.empty_like(comp.flat, dtype=ctx.wire_dtype)
                                        for _ in range(ctx.topology.q)]
                if is_low(ctx.wire_dtype):
                    self.send[comp.name] = torch.empty_like(comp.flat, dtype=ctx.wire_dtype)
        if codec is not None:
            ctx.coded = CodedExchange(codec, ctx.carried(), ctx.comm.world_size,
                                      ctx.topology.neighbours(ctx.rank) if self.gossip else None, ctx.cfg.quant_ring,
                                      full=not self.gossip or ctx.cfg.warmup_steps > 0)
        tau = ctx.cfg.overlap_steps
        self.overlap = OverlapQueue(ctx, self.recv, self.send, self.gossip) if tau > 0 else None
        self.applied: dict[int, list[Component]] = {}  # overlap: step t + tau -> the components whose sync came at t

    def step(self, t: int, due: Due, buffers_due: bool) -> None:
        """Lines 6-17 for the due components this rank carries, then the buffers."""
        ctx = self.ctx
        later = self.overlap is not None  # sync.overlap_steps: sync events are posted now, applied at t + tau
        for f in self.overlap.due(t) if later else []:
            self._apply_inflight(f)
        shared = [c for c, e in due if not (later and e.kind == "sync")] + (self._applied_now(t, due) if later else [])
        if not due and not shared and not buffers_due:  # nothing due, applied or shared at this step
            return
        due = [(c, e) for c, e in due if ctx.carries(c)]
        ring = [(c, e) for c, e in due if self.gossip and e.kind == "sync"]
        full = [(c, e) for c, e in due if not (self.gossip and e.kind == "sync")]
        verdict = ctx.verdict([c for c, _ in full] + ([ctx.buffers] if buffers_due else []))
        for j, (comp, ev) in enumerate(full):  # verdict() gathered them
            if later and ev.kind == "sync":
                self.overlap.post_full(comp, ev, verdict, j)
            else:
                self._apply(comp, ctx.masked_allreduce(comp, ev.kind, verdict, j))
        if ring:
            (self.overlap.post_ring if later else self._gossip_round)(ring)
        ctx.share(shared)
        if buffers_due:
            ctx.sync_buffers(verdict)

    def finalize(self) -> None:
        """The exchanges in flight are applied first (at step T, with the progress made so far), then line 20."""
        for f in self.overlap.due() if self.overlap is not None else []:
            self._apply_inflight(f)
        self.ctx.average_all()

    def state_dict(self) -> dict:
        state = {"overlap": self.overlap.state_dict()} if self.overlap is not None else {}
        if self.ctx.coded is not None:
            state["coded"] = self.ctx.coded.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if (self.ctx.coded is not None) != ("coded" in state):  # first: the payloads in flight differ too
            raise ConfigError(
                f"synchronizer checkpoint {'holds' if 'coded' in state else 'holds no'} int8/int4 wire state, this run "
                f"has sync.exchange_dtype={self.ctx.cfg.exchange_dtype}: resume with the same wire, or start a new "
                "--exp-dir (or train.resume=false)")
        if self.overlap is not None:
            self.overlap.load_state_dict(state.get("overlap", {}))
        if self.ctx.coded is not None:
            self.ctx.coded.load_state_dict(state["coded"])

    def _applied_now(self, t: int, due: Due) -> list[Component]:
        """Every component (carried or not) whose sync posted at t - tau is applied at t: the ones to share.
        Remembered from the events of step t - tau (``due``: every component's, carried or not), else (the
        first tau steps after a resume) read from the schedule."""
        ctx, tau = self.ctx, self.ctx.cfg.overlap_steps
        self.applied[t + tau] = [c for c, e in due if e.kind == "sync"]
        if t in self.applied:
            return self.applied.pop(t)
        return [c for c in ctx.components if t > tau and (ev := event_at(t - tau, c.period, ctx.cfg.warmup_steps,
                                                                          ctx.cfg.warmup_period, c.offset,
                                                                          ctx.cfg.warmup_kind))
                is not None and ev.kind == "sync"]

    def _apply_inflight(self, f: InFlight) -> None:
        """Step t + tau: the average of the snapshots, the rule, the merge with the live model."""
        bar, kind, reset = self.overlap.average(f)
        self._apply(f.comp, kind, bar, self.overlap.snapshot[f.comp.name], reset)

    def _gossip_round(self, due: Due) -> None:
        """Algorithm 1 lines 7-8 for all due components in one batched exchange."""
        ctx = self.ctx
        items, coded = [], ctx.coded
        for comp, ev in due:
            plan = ctx.topology.plan(comp.index, ev.round)
            comp.gather()
            recv_from = plan.recv_from[ctx.rank]  # fewer than q where a pairing leaves this rank out
            if coded is not None:  # int8/int4: quantized messages (coded.py)
                items.append(coded.ring_items(comp, plan.send_to[ctx.rank], recv_from))
                continue
            send = self.send[comp.name].copy_(comp.flat) if comp.name in self.send else comp.flat  # the wire
            items.append([Exchange(comp.name, comp.index, send, plan.send_to[ctx.rank], recv_from,
                                   self.recv[comp.name][:len(recv_from)])])
        ctx.comm.exchange([it for its in items for it in its])
        for (comp, ev), its in zip(due, items):
            recv_from = [src for it in its for src in it.recv_from]
            received = [buf for it in its for buf in it.recv_buffers]
            if coded is not None:
                received = coded.ring_received(comp, recv_from, received)
            dropped, source = neighbour_mean(ctx.cfg.nonfinite, ctx.rank, ctx.t, comp.name, comp.flat,
                                             received, recv_from, health.slots_sick(ctx.slots.get(comp.name)))
            ctx.metrics.nonfinite_dropped += dropped
            if source is not None:
                ctx.record_reset(comp, source)
            self._apply(comp, ev.kind if source is None else "warmup_end")

    def _apply(self, comp: Component, kind: str, avg: Optional[torch.Tensor] = None,
               snapshot: Optional[torch.Tensor] = None, reset: bool = False) -> None:
        """comp.flat holds theta_bar: record divergence, apply the rule, write the parameters. Overlap: the
        average ``avg`` of the ``snapshot`` theta_t instead, merged with the live model (overlap.merge_)."""
        ctx = self.ctx
        out = comp.flat if avg is None else avg  # where the new model lands on the component's device
        if ctx.cfg.track_divergence:
            own = [p.view for p in comp.pieces] if snapshot is None else [snapshot]
            ctx.metrics.divergence[comp.name] = relative_distance(own, out)
        bar = out
        staging = self.staging.get(comp.name)
        if staging is not None:
            bar = staging.copy_(out)
        new = new_local_model(kind, bar, ctx.slots.get(comp.name), ctx.block_momentum, ctx.cfg.block_lr,
                              ctx.cfg.nesterov)
        new = new if new.device == comp.flat.device else out.copy_(new)
        if ctx.coded is not None:
            ctx.coded.after_rule(comp, new)
        if snapshot is None:
            comp.scatter(new)
        else:
            merge_component_(comp, snapshot, new, ctx.cfg.overlap_merge, ctx.cfg.overlap_mix, reset)

