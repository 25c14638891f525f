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

import os
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from .. import health
from ..algorithms import (
    StalenessStats,
    asgd_delta,
    asgd_server_update,
    elastic_center_update_sync,
    elastic_worker_update,
    ssp_may_proceed,
)
from ..comm import CommStats
from ..config import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ..components import Component
    from ..synchronizer import Synchronizer

# services of this process, by the key its RPC session shares with the other ranks
_REGISTRY: dict[str, Any] = {}


def rpc_name(rank: int) -> str:
    return f"gossip_accel{rank}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RpcSession:
    """torch.distributed.rpc for the lifetime of one synchronizer.

    Rendezvous: ``sync.rpc_init_method`` if given, else rank 0 picks a free TCP port on
    ``$MASTER_ADDR`` (127.0.0.1 when unset) and broadcasts it with the process group. The
    local ``service`` is registered under a key all ranks share before RPC starts, so a
    request can never arrive before its handler exists.
    """

    def __init__(self, group: Optional[dist.ProcessGroup], rank: int, world: int, timeout: float,
                 init_method: Optional[str], service: Any):
        try:
            rpc.get_worker_info()
            already = True
        except RuntimeError:
            already = False
        if already:
            raise ConfigError("torch.distributed.rpc is already initialized in this process; the asynchronous "
                              "algorithms start their own RPC session (or use sync.lockstep=true)")
        obj: list = [init_method, None]
        if rank == 0:
            if init_method is None:
                obj[0] = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{_free_port()}"
            obj[1] = uuid.uuid4().hex
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(obj, src=src, group=group)
        self.init_method, self.key = obj
        self.rank = rank
        _REGISTRY[self.key] = service
        opts = rpc.TensorPipeRpcBackendOptions(init_method=self.init_method, rpc_timeout=timeout,
                                               num_worker_threads=max(16, 2 * world + 4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own ProcessGroup deprecation notices from init_rpc
            rpc.init_rpc(rpc_name(rank), rank=rank, world_size=world, rpc_backend_options=opts)
        self.open = True

    def shutdown(self, graceful: bool = True) -> None:
        """``graceful``: wait until every rank is here and no RPC is outstanding anywhere."""
        if self.open:
            self.open = False
            try:
                rpc.shutdown(graceful=graceful)
            finally:
                _REGISTRY.pop(self.key, None)


@rpc.functions.async_execution
def _rpc_push(key: str, comp_ids: list[int], payload: list[torch.Tensor], rank: int, leave: bool):
    return _REGISTRY[key].push(comp_ids, payload, rank, leave)


def _rpc_leave(key: str, rank: int) -> None:
    _REGISTRY[key].leave(rank)


def _rpc_report(key: str) -> dict:
    return _REGISTRY[key].report()


def server_report(sync: "Synchronizer") -> dict:
    """The parameter server's counters (clocks, pushes applied, waiting pulls), from any rank."""
    engine = sync.engine
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
                if self.reject_nonfinite and not health.all_finite(t):
                    self.rejected += 1  # the centre stays finite; the worker resets from the reply
                    warnings.warn(f"gossip_accel: the server rejected a non-finite (NaN/inf) push of component "
                                  f"{self.names[i]!r} from rank {rank}", RuntimeWarning, stacklevel=2)
                elif self.rule == "asgd":
                    asgd_server_update(self.centres[i], t.to(self.centres[i].device), self.server_lr)
                else:  # eq. 9, second line: w~ <- w~ + alpha (w^i - w~) with the worker's w^i as sent
                    elastic_worker_update(self.centres[i], t.to(self.centres[i].device), self.alpha)
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


def relative_distance(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| (worker divergence)."""
    return float(torch.linalg.vector_norm(x - ref)) / (float(torch.linalg.vector_norm(ref)) + 1e-12)


class ServerEngine:
    """EASGD / ASGD for one worker of a :class:`~gossip_accel.sync.synchronizer.Synchronizer`, plus the
    server role when this worker is ``sync.server_rank``."""

    def __init__(self, sync: "Synchronizer", process_group: Optional[dist.ProcessGroup] = None):
        cfg = sync.cfg
        self.sync, self.cfg, self.comm, self.group = sync, cfg, sync.comm, process_group
        self.rank, self.n = sync.rank, sync.world_size
        self.server_rank = cfg.server_rank
        self.is_server = self.rank == self.server_rank
        self.alpha = cfg.resolved_alpha(self.n)
        self.rule = cfg.spec.rule  # easgd | asgd
        self.mode = "sync" if not cfg.spec.asynchronous else ("rpc" if cfg.uses_rpc else "lockstep")
        comps = sync.components
        on_cpu = self.mode == "rpc"
        # the centre variable / global model, held by the server only (001, section 2)
        self.centres: dict[int, torch.Tensor] = {}
        if self.is_server:
            for c in comps:
                self.centres[c.index] = c.gather().detach().to(
                    device="cpu" if on_cpu else c.flat.device, dtype=torch.float32, copy=True)
        # ASGD: the model this worker last pulled (Delta = w - pulled is what it pushes)
        self.pulled = {c.index: c.gather().clone() for c in comps} if self.rule == "asgd" else {}
        self.buf = {c.index: torch.empty_like(c.flat) for c in comps}
        self.scratch = {c.index: torch.empty_like(c.flat) for c in comps} if self.mode != "rpc" else {}
        self.gather_lists: dict[int, list[torch.Tensor]] = {}
        self.reply_lists: dict[int, list[torch.Tensor]] = {}
        if self.is_server and self.mode == "lockstep":
            for c in comps:
                self.gather_lists[c.index] = [torch.empty_like(c.flat) for _ in range(self.n)]
                self.reply_lists[c.index] = [torch.empty_like(c.flat) for _ in range(self.n)]
        self.server: Optional[ParameterServer] = None
        if self.is_server and self.mode != "sync":
            self.server = ParameterServer(
                self.rule, self.centres, {c.index: c.name for c in comps}, self.n, self.alpha, cfg.server_lr,
                cfg.max_staleness if self.mode == "rpc" else None,
                self.comm.stats if self.mode == "rpc" else None,  # lock-step traffic is counted by the collectives
                self.server_rank, reject_nonfinite=cfg.nonfinite != "ignore")
        self.stats = StalenessStats()  # this worker's pushes
        self.pushes = 0
        self.session: Optional[RpcSession] = None
        if self.mode == "rpc":
            self.session = RpcSession(process_group, self.rank, self.n, cfg.rpc_timeout, cfg.rpc_init_method,
                                      self.server)

    # -- one sync ------------------------------------------------------------------------
    def step(self, due: list) -> None:
        comps = [c for c, _ in due]
        if self.mode == "sync":
            self._easgd_sync(comps)
        elif self.mode == "lockstep":
            self._lockstep(comps)
        else:
            self._rpc(comps)
        self.pushes += 1

    def _easgd_sync(self, comps: list["Component"]) -> None:
        """Eq. 8: broadcast w~_t, reduce sum_i w^i_t to the server, both sides update from time-t values.

        With sync.nonfinite a worker whose w^i is NaN/inf (one flag all-reduce per round, health.py)
        sends zeros, the sum and n run over the healthy workers, and it restarts from w~_t."""
        verdict = self.sync._verdict(comps)  # gathers them
        for j, c in enumerate(comps):
            x = c.flat
            centre_t = self.centres[c.index] if self.is_server else self.buf[c.index]
            self.comm.broadcast(c.name, centre_t, src=self.server_rank)
            sick = verdict is not None and verdict.sick[self.rank][j]
            s = self.scratch[c.index].zero_() if sick else self.scratch[c.index].copy_(x)
            self.comm.reduce_sum(c.name, s, dst=self.server_rank)
            if self.cfg.track_divergence:
                self.sync.divergence[c.name] = relative_distance(x, centre_t)
            if sick:
                x.copy_(centre_t)
                self.sync._record_reset(c, "the server's centre variable")
            else:
                elastic_worker_update(x, centre_t, self.alpha)  # before the centre moves: w~_t on the server too
            if self.is_server:
                n = verdict.healthy(j) if verdict is not None else self.n
                elastic_center_update_sync(self.centres[c.index], s, n, self.alpha)
            c.scatter(x)

    def _payload(self, c: "Component", x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.rule == "asgd":
            return asgd_delta(x, self.pulled[c.index], out=out)
        return x if out is None else out.copy_(x)

    def _apply_reply(self, c: "Component", x: torch.Tensor, reply: torch.Tensor) -> None:
        if self.cfg.track_divergence:
            self.sync.divergence[c.name] = relative_distance(x, reply)
        if self.cfg.nonfinite != "ignore" and not health.all_finite(x):  # diverged: restart from the global model
            outcome = "reset" if health.all_finite(reply) else "lost"
            self.sync._record_reset(c, health.single_source_decision(
                self.cfg.nonfinite, self.rank, self.sync.t, c.name, outcome, "the server's global model"))
            x.copy_(reply)
            if self.rule == "asgd":
                self.pulled[c.index].copy_(reply)
            c.scatter(x)
            return
        if self.rule == "asgd":
            x.copy_(reply)
            self.pulled[c.index].copy_(reply)
        else:
            elastic_worker_update(x, reply, self.alpha)  # eq. 9, first line, with the old centre
        c.scatter(x)

    def _lockstep(self, comps: list["Component"]) -> None:
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

    def _rpc(self, comps: list["Component"]) -> None:
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
        comps = self.sync.components
        if self.mode == "rpc":
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
        elif self.mode == "lockstep" and self.rule == "asgd":
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
        if self.mode == "rpc":  # a consistent cut: every push of this step has reached the server ...
            dist.barrier(group=self.group)
        state = {"pulled": {i: t.detach().cpu().clone() for i, t in self.pulled.items()},
                 "centres": {i: t.detach().cpu().clone() for i, t in self.centres.items()},
                 "server": self.server.state_dict() if self.server is not None else None,
                 "stats": self.stats.state_dict(), "pushes": self.pushes}
        if self.mode == "rpc":  # ... and none of the next step has, until the server is saved
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
        if self.mode == "rpc":  # nobody may push before the server is restored: collective here
            dist.barrier(group=self.group)
