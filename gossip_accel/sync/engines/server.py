"""The parameter-server algorithms of 001_3db6b3ddf1f13045.txt: EASGD (eq. 8, eq. 9) and ASGD (eq. 2).

The centre variable w~ (EASGD) or the global model (ASGD) lives on one process of the launch,
``sync.server_rank`` (default 0), which is also a worker: the server role is a set of
handlers that torch.distributed.rpc runs on that process's RPC threads, next to its
training thread, so a slow worker on the server's rank does not slow the server.

Three ways to run, chosen by ``sync.algorithm`` and ``sync.lockstep``:

* ``easgd`` (eq. 8, synchronous): every tau = H_i steps all workers take part in one round:
  the server broadcasts w~_t, receives sum_i w^i_t (a reduce), and every worker and the server
  apply eq. 8. torch.distributed collectives, deterministic.
* ``easgd_async`` (eq. 9) and ``asgd`` (eq. 2), asynchronous (default): every tau steps the
  worker makes one RPC to the server ("push" its model or its update, "pull" the centre or the
  new model) and continues; the server applies pushes in arrival order. Staleness k of eq. 2
  is measured per push; ``sync.max_staleness = S`` bounds it (stale synchronous parallel,
  :func:`~gossip_accel.sync.algorithms.asgd.ssp_may_proceed`). Workers at different speeds never
  deadlock: the slowest worker never waits, a finished worker leaves the bound, and the
  final push / leave, ``rpc.shutdown`` (which waits for every outstanding call) and the final
  broadcast of the server's model end the run cleanly.
* the same two with ``sync.lockstep: true``: every tau steps the server gathers all workers'
  pushes and applies them in rank order, then scatters the replies. The result is the
  asynchronous rule with a fixed arrival order (deterministic: the multi-process tests compare
  it with the simulator).

The final model of every worker is the server's (EASGD's output is the centre variable).
"""
from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from ..algorithms import StalenessStats, asgd_delta, elastic_center_update_sync, ssp_may_proceed
from ..comm import CommStats
from ..components import Component
from ..worker import easgd_sync_worker, relative_distance, server_push, server_reply
from .base import Due, Engine, EngineContext
from .rpc import RpcSession, rpc_name, service


@rpc.functions.async_execution
def _rpc_push(key: str, comp_ids: list[int], payload: list[torch.Tensor], rank: int, leave: bool):
    return service(key).push(comp_ids, payload, rank, leave)


def _rpc_leave(key: str, rank: int) -> None:
    service(key).leave(rank)


def _rpc_report(key: str) -> dict:
    return service(key).report()


def server_report(sync: Any) -> dict:
    """The parameter server's counters (clocks, pushes applied, waiting pulls), from any rank
    (``sync``: a Synchronizer running EASGD/ASGD, or its engine)."""
    engine = getattr(sync, "engine", sync)
    if engine.server is not None:
        return engine.server.report()
    return rpc.rpc_sync(rpc_name(engine.server_rank), _rpc_report, args=(engine.session.key,),
                        timeout=engine.cfg.rpc_timeout)


@dataclass
class _Waiter:
    rank: int
    comp_ids: list[int]
    reply: Optional[list[torch.Tensor]]  # EASGD: fixed at push time; ASGD: taken at release
    future: torch.futures.Future
    staleness: int
    counted: bool = False


class ParameterServer:
    """The server role: holds w~ per component and applies pushes in arrival order (thread-safe).

    ``rule`` is ``asgd`` (eq. 2: w~ <- w~ + server_lr * Delta, reply the new w~) or ``easgd``
    (eq. 9: reply the old w~, then w~ <- w~ + alpha (w^i - w~)). Bookkeeping per worker: its
    clock (pushes), the server version it last pulled (staleness k = versions since), the
    number of pushes applied (no update is lost: it equals the number the worker sent).
    """

    def __init__(self, rule: str, centres: dict[int, torch.Tensor], names: dict[int, str], n: int, alpha: float,
                 server_lr: float, max_staleness: Optional[int], stats: Optional[CommStats], server_rank: int,
                 reject_nonfinite: bool = True):
        self.rule, self.centres, self.names, self.n = rule, centres, names, n
        self.reject_nonfinite = reject_nonfinite  # sync.nonfinite != ignore: a NaN/inf push is not applied
        self.rejected = 0
        self.alpha, self.server_lr, self.max_staleness = alpha, server_lr, max_staleness
        self.stats, self.server_rank = stats, server_rank
        self.lock = threading.Lock()
        self.version = 0
        self.clock = [0] * n
        self.pulled = [0] * n
        self.applied = [0] * n
        self.training = set(range(n))
        self.waiting: list[_Waiter] = []
        self.staleness = StalenessStats()

    def push(self, comp_ids: list[int], payload: list[torch.Tensor], rank: int, leave: bool = False
             ) -> torch.futures.Future:
        """Apply worker ``rank``'s push now; the returned future holds (reply, info) once SSP lets it pull."""
        fut: torch.futures.Future = torch.futures.Future()
        with self.lock:
            k = self.version - self.pulled[rank]
            reply = None
            if self.rule == "easgd":
                reply = [self.centres[i].clone() for i in comp_ids]
            for i, t in zip(comp_ids, payload):
                centre = self.centres[i]
                if not server_push(self.rule, centre, t.to(centre.device), self.alpha, self.server_lr,
                                   self.reject_nonfinite):
                    self.rejected += 1  # the centre stays finite; the worker resets from the reply
                    warnings.warn(f"gossip_accel: the server rejected a non-finite (NaN/inf) push of component "
                                  f"{self.names[i]!r} from rank {rank}", RuntimeWarning, stacklevel=2)
            self.version += 1
            self.applied[rank] += 1
            self.staleness.add(k)
            if self.rule == "easgd":
                self.pulled[rank] = self.version
            if leave:
                self.training.discard(rank)
                ready = [(fut, (None, {"staleness": k, "version": self.version, "clock_gap": 0}))]
            else:
                self.clock[rank] += 1
                self.waiting.append(_Waiter(rank, list(comp_ids), reply, fut, k))
                ready = []
            ready += self._release()
        if rank != self.server_rank and self.stats is not None:
            for i, t in zip(comp_ids, payload):
                nbytes = t.numel() * t.element_size()
                self.stats.add(self.names[i], 0 if leave else nbytes, nbytes, 0.0)
        for f, value in ready:
            f.set_result(value)
        return fut

    def leave(self, rank: int) -> None:
        """Worker ``rank`` stops training: it no longer holds the others back (SSP)."""
        with self.lock:
            self.training.discard(rank)
            ready = self._release()
        for f, value in ready:
            f.set_result(value)

    def _release(self) -> list:
        """Pulls that SSP now allows (call with the lock held)."""
        if not self.waiting:
            return []
        clocks = [self.clock[r] for r in self.training]
        out = []
        for w in list(self.waiting):
            if not ssp_may_proceed(self.clock[w.rank], clocks, self.max_staleness):
                if not w.counted:
                    w.counted = True
                    self.staleness.waits += 1
                continue
            gap = self.clock[w.rank] - min(clocks) if clocks else 0
            self.staleness.max_clock_gap = max(self.staleness.max_clock_gap, gap)
            reply = w.reply
            if reply is None:  # ASGD pulls the newest model at release
                reply = [self.centres[i].clone() for i in w.comp_ids]
                self.pulled[w.rank] = self.version
            self.waiting.remove(w)
            out.append((w.future, (reply, {"staleness": w.staleness, "version": self.version, "clock_gap": gap})))
        return out

    def report(self) -> dict:
        with self.lock:
            return {"version": self.version, "applied": list(self.applied), "clock": list(self.clock),
                    "waiting": len(self.waiting), "training": sorted(self.training), "rejected": self.rejected,
                    "staleness": self.staleness.state_dict()}

    def state_dict(self) -> dict:
        with self.lock:
            return {"version": self.version, "clock": list(self.clock), "pulled": list(self.pulled),
                    "applied": list(self.applied), "staleness": self.staleness.state_dict(),
                    "centres": {i: c.detach().cpu().clone() for i, c in self.centres.items()}}

    def load_state_dict(self, state: dict) -> None:
        with self.lock:
            self.version = state["version"]
            self.clock, self.pulled, self.applied = list(state["clock"]), list(state["pulled"]), list(state["applied"])
            self.staleness.load_state_dict(state["staleness"])
            for i, c in state["centres"].items():
                self.centres[int(i)].copy_(c)


class ServerEngine(Engine):
    """EASGD / ASGD for one worker (registry family ``server``), plus the server role when this worker
    is ``sync.server_rank``. Three ways to run (module docstring): ``collective`` (synchronous EASGD,
    eq. 8), ``rpc`` (asynchronous) or lock-step (the asynchronous rules in rank order)."""

    def __init__(self, ctx: EngineContext):
        super().__init__(ctx)
        cfg = ctx.cfg
        self.cfg, self.comm, self.group = cfg, ctx.comm, ctx.group
        self.rank, self.n = ctx.rank, ctx.world_size
        self.server_rank = cfg.server_rank
        self.is_server = self.rank == self.server_rank
        self.alpha = cfg.resolved_alpha(self.n)
        self.rule = cfg.spec.rule  # easgd | asgd (algorithms/)
        self.collective = not cfg.spec.asynchronous  # eq. 8: a broadcast and a reduce per round
        self.rpc = cfg.uses_rpc
        self.syncs_buffers_in_step = not self.rpc
        comps = ctx.components
        # the centre variable / global model, held by the server only (001, section 2)
        self.centres: dict[int, torch.Tensor] = {}
        if self.is_server:
            for c in comps:
                self.centres[c.index] = c.gather().detach().to(
                    device="cpu" if self.rpc else c.flat.device, dtype=torch.float32, copy=True)
        # ASGD: the model this worker last pulled (Delta = w - pulled is what it pushes)
        self.pulled = {c.index: c.gather().clone() for c in comps} if self.rule == "asgd" else {}
        self.buf = {c.index: torch.empty_like(c.flat) for c in comps}
        self.scratch = {c.index: torch.empty_like(c.flat) for c in comps} if not self.rpc else {}
        self.gather_lists: dict[int, list[torch.Tensor]] = {}
        self.reply_lists: dict[int, list[torch.Tensor]] = {}
        lockstep = not (self.collective or self.rpc)
        if self.is_server and lockstep:
            for c in comps:
                self.gather_lists[c.index] = [torch.empty_like(c.flat) for _ in range(self.n)]
                self.reply_lists[c.index] = [torch.empty_like(c.flat) for _ in range(self.n)]
        self.server: Optional[ParameterServer] = None
        if self.is_server and not self.collective:
            self.server = ParameterServer(
                self.rule, self.centres, {c.index: c.name for c in comps}, self.n, self.alpha, cfg.server_lr,
                cfg.max_staleness if self.rpc else None,
                self.comm.stats if self.rpc else None,  # lock-step traffic is counted by the collectives
                self.server_rank, reject_nonfinite=cfg.nonfinite != "ignore")
        self.stats = StalenessStats()  # this worker's pushes
        self.pushes = 0
        self.session: Optional[RpcSession] = None
        if self.rpc:
            self.session = RpcSession(ctx.group, self.rank, self.n, cfg.rpc_timeout, cfg.rpc_init_method, self.server)

    # -- one sync ------------------------------------------------------------------------
    def step(self, t: int, due: Due, buffers_due: bool) -> None:
        if due:
            comps = [c for c, _ in due]
            if self.collective:
                self._easgd_sync(comps)
            elif self.rpc:
                self._rpc(comps)
            else:
                self._lockstep(comps)
            self.pushes += 1
        if buffers_due:
            self.ctx.sync_buffers()

    def _divergence(self, c: Component, x: torch.Tensor, ref: torch.Tensor) -> None:
        if self.cfg.track_divergence:
            self.ctx.metrics.divergence[c.name] = relative_distance([x], ref)

    def _easgd_sync(self, comps: list[Component]) -> None:
        """Eq. 8: broadcast w~_t, reduce sum_i w^i_t to the server, both sides update from time-t values.

        With sync.nonfinite a worker whose w^i is NaN/inf (one flag all-reduce per round, health.py)
        sends zeros, the sum and n run over the healthy workers, and it restarts from w~_t."""
        verdict = self.ctx.verdict(comps)  # gathers them
        for j, c in enumerate(comps):
            x = c.flat
            centre_t = self.centres[c.index] if self.is_server else self.buf[c.index]
            self.comm.broadcast(c.name, centre_t, src=self.server_rank)
            sick = verdict is not None and verdict.sick[self.rank][j]
            s = self.scratch[c.index].zero_() if sick else self.scratch[c.index].copy_(x)
            self.comm.reduce_sum(c.name, s, dst=self.server_rank)
            self._divergence(c, x, centre_t)
            source = easgd_sync_worker(x, centre_t, self.alpha, sick)  # before the centre moves: w~_t on the server too
            if source is not None:
                self.ctx.record_reset(c, source)
            if self.is_server:
                n = verdict.healthy(j) if verdict is not None else self.n
                elastic_center_update_sync(self.centres[c.index], s, n, self.alpha)
            c.scatter(x)

    def _payload(self, c: Component, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.rule == "asgd":
            return asgd_delta(x, self.pulled[c.index], out=out)
        return x if out is None else out.copy_(x)

    def _apply_reply(self, c: Component, x: torch.Tensor, reply: torch.Tensor) -> None:
        self._divergence(c, x, reply)
        source = server_reply(self.rule, self.cfg.nonfinite, self.rank, self.ctx.t, c.name, x, reply, self.alpha,
                              self.pulled.get(c.index))
        if source is not None:
            self.ctx.record_reset(c, source)
        c.scatter(x)

    def _lockstep(self, comps: list[Component]) -> None:
        """Every worker pushes; the server applies the pushes in rank order and scatters the replies."""
        xs = [c.gather() for c in comps]
        for c, x in zip(comps, xs):
            payload = self._payload(c, x, out=self.scratch[c.index])
            self.comm.gather(c.name, payload, self.gather_lists.get(c.index), dst=self.server_rank)
        if self.is_server:
            ids = [c.index for c in comps]
            for k in range(self.n):  # arrival order = rank order
                reply, _ = self.server.push(ids, [self.gather_lists[i][k] for i in ids], k).wait()
                for i, r in zip(ids, reply):
                    self.reply_lists[i][k].copy_(r)
        for c, x in zip(comps, xs):
            self.comm.scatter(c.name, self.buf[c.index], self.reply_lists.get(c.index), src=self.server_rank)
            self._apply_reply(c, x, self.buf[c.index])

    def _call(self, ids: list[int], payload: list[torch.Tensor], leave: bool = False):
        if self.is_server:
            return self.server.push(ids, payload, self.rank, leave).wait()
        return rpc.rpc_sync(rpc_name(self.server_rank), _rpc_push, args=(self.session.key, ids, payload, self.rank,
                                                                          leave), timeout=self.cfg.rpc_timeout)

    def _rpc(self, comps: list[Component]) -> None:
        """One RPC: push the model (EASGD) or the update (ASGD) of the due components, pull the reply."""
        xs = [c.gather() for c in comps]
        payload = [self._payload(c, x).detach().to("cpu", copy=True) for c, x in zip(comps, xs)]
        start = time.perf_counter()
        reply, info = self._call([c.index for c in comps], payload)
        seconds = time.perf_counter() - start
        self.stats.add(info["staleness"])
        self.stats.max_clock_gap = max(self.stats.max_clock_gap, info["clock_gap"])
        total = sum(x.numel() for x in xs) or 1
        for c, x, r in zip(comps, xs, reply):
            if not self.is_server:
                self.comm.stats.add(c.name, x.numel() * 4, x.numel() * 4, seconds * x.numel() / total)
            self._apply_reply(c, x, r.to(x.device))

    # -- the end -------------------------------------------------------------------------
    def finalize(self) -> None:
        """Last ASGD push (no update lost), leave, close RPC, then every worker <- the server's model."""
        comps = self.ctx.components
        if self.rpc:
            if self.rule == "asgd":
                payload = [self._payload(c, c.gather()).detach().to("cpu", copy=True) for c in comps]
                self._call([c.index for c in comps], payload, leave=True)
                if not self.is_server:
                    for c, t in zip(comps, payload):
                        self.comm.stats.add(c.name, t.numel() * 4, 0, 0.0)
            elif self.is_server:
                self.server.leave(self.rank)
            else:
                rpc.rpc_sync(rpc_name(self.server_rank), _rpc_leave, args=(self.session.key, self.rank),
                             timeout=self.cfg.rpc_timeout)
            self.session.shutdown(graceful=True)  # returns when no RPC is outstanding anywhere
        elif not self.collective and self.rule == "asgd":
            for c in comps:  # the local steps since the last pull (steps not a multiple of H_i)
                x = c.gather()
                self.comm.gather(c.name, self._payload(c, x, out=self.scratch[c.index]), self.gather_lists.get(c.index),
                                 dst=self.server_rank)
            if self.is_server:
                ids = [c.index for c in comps]
                for k in range(self.n):
                    self.server.push(ids, [self.gather_lists[i][k] for i in ids], k, leave=True).wait()
        for c in comps:
            buf = self.buf[c.index]
            if self.is_server:
                buf.copy_(self.centres[c.index])
            self.comm.broadcast(c.name, buf, src=self.server_rank)
            c.scatter(buf)
            if self.rule == "asgd":
                self.pulled[c.index].copy_(buf)

    def close(self) -> None:
        """Abort: leave RPC without waiting for the others (after an exception)."""
        if self.session is not None:
            self.session.shutdown(graceful=False)

    # -- metrics and state ---------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"sync/pushes": float(self.pushes)}
        if self.stats.count:
            out.update({"sync/staleness_mean": self.stats.mean, "sync/staleness_max": float(self.stats.max),
                        "sync/clock_gap_max": float(self.stats.max_clock_gap)})
        if self.server is not None:
            r = self.server.report()
            st = r["staleness"]
            out.update({"sync/server/pushes": float(sum(r["applied"])), "sync/server/version": float(r["version"]),
                        "sync/server/staleness_mean": st["total"] / st["count"] if st["count"] else 0.0,
                        "sync/server/staleness_max": float(st["max"]),
                        "sync/server/clock_gap_max": float(st["max_clock_gap"]),
                        "sync/server/waits": float(st["waits"]),
                        "sync/server/rejected_nonfinite": float(r["rejected"])})
        return out

    def report(self) -> dict:
        """Everything the tests check: this worker's pushes and staleness, and the server's view."""
        return {"pushes": self.pushes, "staleness": self.stats.state_dict(),
                "server": self.server.report() if self.server is not None else None}

    def state_dict(self) -> dict:
        if self.rpc:  # a consistent cut: every push of this step has reached the server ...
            dist.barrier(group=self.group)
        state = {"pulled": {i: t.detach().cpu().clone() for i, t in self.pulled.items()},
                 "centres": {i: t.detach().cpu().clone() for i, t in self.centres.items()},
                 "server": self.server.state_dict() if self.server is not None else None,
                 "stats": self.stats.state_dict(), "pushes": self.pushes}
        if self.rpc:  # ... and none of the next step has, until the server is saved
            dist.barrier(group=self.group)
        return state

    def load_state_dict(self, state: dict) -> None:
        for i, t in state.get("pulled", {}).items():
            self.pulled[int(i)].copy_(t)
        if self.server is not None and state.get("server") is not None:
            self.server.load_state_dict(state["server"])  # includes the centres
        else:
            for i, t in state.get("centres", {}).items():
                self.centres[int(i)].copy_(t)
        self.stats.load_state_dict(state.get("stats", {}))
        self.pushes = int(state.get("pushes", 0))
        if self.rpc:  # nobody may push before the server is restored: collective here
            dist.barrier(group=self.group)
