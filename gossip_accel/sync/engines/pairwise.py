"""ADPSGD (Cui et al. 2021, 002/004): every sync, each worker averages with one ring neighbour.

The pairs of a round come from :class:`~gossip_accel.sync.topology.PairTopology` (``fixed``:
alternate right/left neighbour; ``random``: a seeded random matching of actives and
passives). Round r is the worker's r-th synchronization step. Two ways to run:

* asynchronous (default): an *active* worker (even rank) sends its model to its partner with
  one RPC and averages with the reply; the *passive* partner (odd rank) answers from its RPC
  threads, without involving its training thread, with the model it published at its last
  sync, and adds its half of the average, (x_active - x_published)/2, to its live model at
  its next sync (:func:`~gossip_accel.sync.algorithms.adpsgd.passive_absorb`). Nobody waits for a
  slow worker: an active only waits for the round trip, the passive never waits. This is the
  straggler resilience of ADPSGD. ``adpsgd_delay`` sends the request without waiting for the
  reply and applies it at the next sync (delay-by-one: the exchange overlaps the next local
  step).
* ``sync.lockstep: true``: the two partners exchange with point-to-point send/recv and both
  apply the exact pairwise average (delay-by-one: the exchange of round r is posted at round
  r and completed and applied at round r + 1). Deterministic; the multi-process tests compare
  it with the simulator.

At the end every worker applies what is still pending, RPC shuts down (waiting for every
outstanding call), and all replicas are averaged (as Algorithm 1, line 20).
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from .. import health
from ..algorithms import passive_absorb
from ..comm import CommStats, Exchange, PendingExchange
from ..components import Component
from ..worker import pair_merge, relative_distance
from .base import Due, Engine, EngineContext
from .rpc import RpcSession, rpc_name, service


def _rpc_average(key: str, comp_ids: list[int], xs: list[torch.Tensor], sender: int, round_: int):
    return service(key).average(comp_ids, xs, sender, round_)


class PassiveService:
    """The passive side of asynchronous ADPSGD on one worker (thread-safe).

    ``published``: the model as of this worker's last sync (CPU copies); ``pending``: the
    corrections received since, added to the live model at the next sync.
    """

    def __init__(self, comps: list[Component], stats: Optional[CommStats]):
        self.lock = threading.Lock()
        self.published = {c.index: c.gather().detach().to("cpu", dtype=torch.float32, copy=True) for c in comps}
        self.pending = {i: torch.zeros_like(t) for i, t in self.published.items()}
        self.names = {c.index: c.name for c in comps}
        self.rescue: dict[int, tuple[torch.Tensor, int]] = {}  # a finite incoming model, kept while published is not
        self.dirty: set[int] = set()
        self.served: dict[int, int] = defaultdict(int)
        self.step = 0
        self.stats = stats

    def average(self, comp_ids: list[int], xs: list[torch.Tensor], sender: int, round_: int):
        with self.lock:
            replies = []
            for i, x in zip(comp_ids, xs):
                ok, mine = health.all_finite(x), health.all_finite(self.published[i])
                if ok and not mine:  # this passive diverged: keep the active's model to reset from (absorb)
                    self.rescue[i] = (x.clone(), sender)
                replies.append(passive_absorb(self.published[i], self.pending[i], x) if ok and mine
                               else self.published[i].clone())  # a non-finite model is dropped, not averaged
            self.dirty.update(comp_ids)
            self.served[sender] += 1
            step = self.step
        if self.stats is not None:
            for i, x in zip(comp_ids, xs):
                self.stats.add(self.names[i], x.numel() * x.element_size(), x.numel() * x.element_size(), 0.0)
        return replies, {"step": step}

    def absorb(self, comps: list[Component], step: int) -> list[tuple[Component, int]]:
        """At a sync of the training thread: live model += pending, then publish it. A non-finite live
        model is reset to the last finite model an active sent (returned: (component, its rank))."""
        resets = []
        with self.lock:
            for c in comps:
                x = c.gather()
                if c.index in self.dirty:
                    x.add_(self.pending[c.index].to(x.device))
                    c.scatter(x)
                    self.pending[c.index].zero_()
                rescue = self.rescue.pop(c.index, None)
                if rescue is not None and not health.all_finite(x):
                    x.copy_(rescue[0].to(x.device))
                    c.scatter(x)
                    resets.append((c, rescue[1]))
                self.published[c.index].copy_(x)
            self.dirty.clear()
            self.step = step
        return resets


class PairwiseEngine(Engine):
    """ADPSGD for one worker (registry family ``pairwise``): lock-step point-to-point, or RPC."""

    def __init__(self, ctx: EngineContext):
        super().__init__(ctx)
        cfg = ctx.cfg
        self.cfg, self.comm, self.topology, self.group = cfg, ctx.comm, ctx.topology, ctx.group
        self.rank, self.n = ctx.rank, ctx.world_size
        self.delay = cfg.spec.delayed
        self.rpc = cfg.uses_rpc
        self.syncs_buffers_in_step = not self.rpc
        self.round = 0
        comps = ctx.components
        self.recv = {c.index: torch.empty_like(c.flat) for c in comps} if not self.rpc else {}
        self.sent = {c.index: torch.empty_like(c.flat) for c in comps} if self.delay and not self.rpc else {}
        self.pending = None  # the exchange of the previous round (delay-by-one)
        self.active = self.topology.is_active(self.rank)
        self.requests = 0
        self.lag_total = 0
        self.lag_max = 0
        self.service: Optional[PassiveService] = None
        self.session: Optional[RpcSession] = None
        if self.rpc:
            if not self.active:
                self.service = PassiveService(comps, ctx.comm.stats)
            self.session = RpcSession(ctx.group, self.rank, self.n, cfg.rpc_timeout, cfg.rpc_init_method,
                                      self.service)

    # -- one sync ------------------------------------------------------------------------
    def step(self, t: int, due: Due, buffers_due: bool) -> None:
        if due:
            self.round += 1
            comps = [c for c, _ in due]
            if not self.rpc:
                self._lockstep(comps)
            elif self.active:
                self._active(comps)
            else:
                self._absorb()
        if buffers_due:
            self.ctx.sync_buffers()

    def _absorb(self) -> None:
        for c, sender in self.service.absorb(self.ctx.components, self.ctx.t):
            self.ctx.record_reset(c, f"the model of its partner rank {sender}")

    def _pair(self, c: Component, x: torch.Tensor, other: torch.Tensor, partner: str,
              sent: Optional[torch.Tensor] = None) -> None:
        """x <- the pairwise average (delay-by-one: with ``sent``) and write it (worker.pair_merge)."""
        dropped, source = pair_merge(self.cfg.nonfinite, self.rank, self.ctx.t, c.name, x, other, partner, sent)
        self.ctx.metrics.nonfinite_dropped += dropped
        if source is not None:
            self.ctx.record_reset(c, source)
        c.scatter(x)

    def _divergence(self, c: Component, x: torch.Tensor, other: torch.Tensor) -> None:
        if self.cfg.track_divergence:
            self.ctx.metrics.divergence[c.name] = relative_distance([x], (x + other) * 0.5)

    def _lockstep(self, comps: list[Component]) -> None:
        if self.delay:
            self._resolve_lockstep()
        j = self.topology.partner(self.rank, self.round)
        if not self.delay:
            items = [Exchange(c.name, c.index, c.gather(), [j], [j], [self.recv[c.index]]) for c in comps]
            self.comm.exchange(items)
            for c in comps:
                self._divergence(c, c.flat, self.recv[c.index])
                self._pair(c, c.flat, self.recv[c.index], f"the model of its partner rank {j}")
            return
        items = [Exchange(c.name, c.index, self.sent[c.index].copy_(c.gather()), [j], [j], [self.recv[c.index]])
                 for c in comps]
        self.pending = (self.comm.exchange_start(items), comps)

    def _resolve_lockstep(self) -> None:
        if self.pending is None:
            return
        handle, comps = self.pending
        self.comm.exchange_finish(handle)
        for c in comps:
            x = c.gather()
            self._divergence(c, self.sent[c.index], self.recv[c.index])
            self._pair(c, x, self.recv[c.index], "its partner's model of the previous round", self.sent[c.index])
        self.pending = None

    def _active(self, comps: list[Component]) -> None:
        if self.delay:
            self._resolve_rpc()
        j = self.topology.partner(self.rank, self.round)
        ids = [c.index for c in comps]
        xs = [c.gather().detach().to("cpu", copy=True) for c in comps]
        args = (self.session.key, ids, xs, self.rank, self.round)
        start = time.perf_counter()
        self.requests += 1
        self._account_bytes(comps, xs)  # counted when sent: a reply collected by finalize is per-step traffic
        if self.delay:
            fut = rpc.rpc_async(rpc_name(j), _rpc_average, args=args, timeout=self.cfg.rpc_timeout)
            self.pending = (fut, comps, xs, self.comm.stats)
            return
        replies, info = rpc.rpc_sync(rpc_name(j), _rpc_average, args=args, timeout=self.cfg.rpc_timeout)
        self._account_wait(comps, xs, time.perf_counter() - start, info, self.comm.stats)
        for c, r in zip(comps, replies):
            x = c.gather()
            r = r.to(x.device)
            self._divergence(c, x, r)
            self._pair(c, x, r, f"the model of its partner rank {j}")

    def _resolve_rpc(self) -> None:
        if self.pending is None:
            return
        fut, comps, xs, stats = self.pending
        wait = time.perf_counter()
        replies, info = fut.wait()
        self._account_wait(comps, xs, time.perf_counter() - wait, info, stats)
        for c, sent, r in zip(comps, xs, replies):
            x = c.gather()
            self._divergence(c, sent, r)
            self._pair(c, x, r.to(x.device), "its partner's model of the previous round", sent.to(x.device))
        self.pending = None

    def _account_bytes(self, comps, xs) -> None:
        for c, x in zip(comps, xs):
            nbytes = x.numel() * x.element_size()
            self.comm.stats.add(c.name, nbytes, nbytes, 0.0)

    def _account_wait(self, comps, xs, seconds: float, info: dict, stats: CommStats) -> None:
        total = sum(x.numel() for x in xs) or 1
        for c, x in zip(comps, xs):
            stats.add(c.name, 0, 0, seconds * x.numel() / total, call=False)
        lag = abs(self.ctx.t - int(info.get("step", 0)))
        self.lag_total += lag
        self.lag_max = max(self.lag_max, lag)

    # -- the end -------------------------------------------------------------------------
    def finalize(self) -> None:
        """Apply what is pending, stop RPC (waits for all outstanding calls), average all replicas."""
        if not self.rpc:
            self._resolve_lockstep()
        else:
            if self.active:
                self._resolve_rpc()
            self.session.shutdown(graceful=True)
            if self.service is not None:
                self._absorb()
        self.ctx.average_all()

    def close(self) -> None:
        if self.session is not None:
            self.session.shutdown(graceful=False)

    # -- metrics and state ---------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        out = {"sync/adpsgd/round": float(self.round)}
        if self.rpc and self.active:
            out["sync/adpsgd/requests"] = float(self.requests)
            if self.requests:
                out["sync/adpsgd/partner_step_lag_mean"] = self.lag_total / self.requests
                out["sync/adpsgd/partner_step_lag_max"] = float(self.lag_max)
        if self.service is not None:
            with self.service.lock:
                out["sync/adpsgd/served"] = float(sum(self.service.served.values()))
        return out

    def report(self) -> dict:
        served = None
        if self.service is not None:
            with self.service.lock:
                served = dict(self.service.served)
        return {"round": self.round, "active": self.active, "requests": self.requests, "served": served,
                "lag_max": self.lag_max}

    def state_dict(self) -> dict:
        """Delay-by-one: the exchange in flight is completed (not applied) and saved with the sent model.

        In RPC mode this is a collective (a consistent cut): the actives collect their replies,
        then all ranks meet, then the passives save their pending corrections.
        """
        state: dict = {"round": self.round, "requests": self.requests}
        if not self.rpc and self.pending is not None:
            handle, comps = self.pending
            self.comm.exchange_finish(handle)  # idempotent: the resolve later does not wait again
            state["pending"] = {c.index: {"sent": self.sent[c.index].cpu().clone(),
                                          "recv": self.recv[c.index].cpu().clone()} for c in comps}
        if self.rpc:
            if self.pending is not None:
                fut, comps, xs, stats = self.pending
                replies, _ = fut.wait()
                state["pending"] = {c.index: {"sent": x.clone(), "recv": r.clone()}
                                    for c, x, r in zip(comps, xs, replies)}
            dist.barrier(group=self.group)
        if self.service is not None:
            with self.service.lock:
                state["pending_corrections"] = {i: t.clone() for i, t in self.service.pending.items()}
        if self.rpc:  # no request of the next round before every passive is saved
            dist.barrier(group=self.group)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.round = int(state.get("round", 0))
        self.requests = int(state.get("requests", 0))
        pending = {int(i): v for i, v in (state.get("pending") or {}).items()}
        comps = [c for c in self.ctx.components if c.index in pending]
        if pending and not self.rpc:
            for c in comps:
                self.sent[c.index].copy_(pending[c.index]["sent"])
                self.recv[c.index].copy_(pending[c.index]["recv"])
            self.pending = (PendingExchange([], [], done=True), comps)
        elif pending:  # RPC: a future that is already resolved
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(([pending[c.index]["recv"] for c in comps], {"step": self.ctx.t}))
            self.pending = (fut, comps, [pending[c.index]["sent"] for c in comps], self.comm.stats)
        if self.service is not None:
            with self.service.lock:
                for i, t in state.get("pending_corrections", {}).items():
                    self.service.pending[int(i)].zero_().add_(t)
                    self.service.dirty.add(int(i))
                for c in self.ctx.components:  # publish the restored model, not the one at construction
                    self.service.published[c.index].copy_(c.gather())
        if self.rpc:  # no request before every passive has published: collective here
            dist.barrier(group=self.group)
