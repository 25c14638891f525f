"""The oracle: n workers simulated in ONE process with plain tensors.

It uses the same components, schedule, topology and update-rule code as the
:class:`~gossip_accel.sync.synchronizer.Synchronizer`, but no torch.distributed: averages are computed
directly from the n replicas. A distributed run with the same seeds and data must end with
the same parameters (tests/test_distributed_equals_simulator.py).

The asynchronous algorithms (ASGD, async EASGD, ADPSGD) are simulated in their deterministic
lock-step order (``sync.lockstep: true`` in a distributed run): the server takes the pushes
of a round in rank order; ADPSGD's partners average exactly. :class:`HierarchicalCluster` is the
oracle of ``sync.hierarchy`` (groups of ranks), and ``sync.exchange_dtype`` is rounded exactly as
the transport rounds it (:mod:`gossip_accel.sync.precision`). ``sync.stagger`` shifts each component's
sync steps by its offset, and ``sync.overlap_steps`` = tau keeps the replicas' snapshots of a sync step
t and applies their average (rule and merge, :mod:`gossip_accel.sync.overlap`) at t + tau, as the
periodic engine does (an int8/int4 ring: the payloads coded at t, decoded into the copies at t + tau).

CLI: ``gossip-simulate --workers 8 --steps 400`` (or ``python -m gossip_accel.sync.simulate``)
compares the algorithms on the toy task of :mod:`gossip_accel.sync.toy` and prints a table.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Optional, Sequence

import torch

from . import health
from .algorithms import asgd_delta, elastic_center_update_sync, new_local_model, start_slots
from .components import split_buffers, split_components
from .config import ALGORITHMS, ConfigError, check_group_size, load_sync_config, validate_for_world
from .health import neighbour_mean_
from .inner_state import AVERAGING_EVENTS, as_component, reset_, state_slices
from .overlap import merge_component_
from .precision import is_low, simulated_full_mean, wire_dtype, wire_round
from .quantize import codec_of, coded_state, ring_receive, ring_send, simulated_coded_mean
from .schedule import event_at, needs_gradient_allreduce, stagger_offsets
from .topology import RingTopology, make_topology
from .warmup import mean_gradients_, restart_slots
from .worker import easgd_sync_worker, neighbour_mean, pair_merge, record_reset, server_push, server_reply


class SimulatedCluster:
    """n replicas of a model and the synchronization of Algorithm 1 among them.

    ``optimizers``: the replicas' inner optimizers (one each), needed by ``sync.inner_state``. With
    ``sync.warmup_kind=gradients`` the training loop calls :meth:`allreduce_gradients` between the
    replicas' backward and their optimizer steps (as DDP would average them).
    """

    def __init__(self, models: Sequence[torch.nn.Module], config: Any = None, overrides: Sequence[str] = (),
                 optimizers: Optional[Sequence[torch.optim.Optimizer]] = None):
        self.cfg = load_sync_config(config, overrides)
        self.models = list(models)
        self.optimizers = list(optimizers) if optimizers is not None else None
        if self.cfg.inner_state != "keep" and (self.optimizers is None or len(self.optimizers) != len(self.models)):
            raise ConfigError(f"sync.inner_state={self.cfg.inner_state}: give SimulatedCluster one optimizer per "
                              "replica (optimizers=...)")
        self.n = n = len(self.models)
        cfg = self.cfg
        validate_for_world(cfg, n)
        self.comps = [split_components(m.named_parameters(), cfg.components, cfg.period) for m in self.models]
        offsets = stagger_offsets([c.period for c in self.comps[0]], cfg.stagger)
        for comps in self.comps:
            for comp, offset in zip(comps, offsets):
                comp.offset = offset
        period = min(c.period for c in self.comps[0])
        self.bufs = [split_buffers(m.named_buffers(), period) if cfg.buffers != "local" else None for m in self.models]
        self.topology = make_topology(cfg.algorithm, n, cfg.resolved_p(n), cfg.resolved_q(n), cfg.seed, cfg.round_mixing) if n > 1 else None
        self.block_momentum = cfg.resolved_block_momentum(n)
        self.wire = wire_dtype(cfg.exchange_dtype)  # sync.exchange_dtype: the same rounding as comm.py
        self.t = 0
        if cfg.enabled and cfg.broadcast_initial:
            for k in range(1, n):
                for src, dst in zip(self._with_buffers(0), self._with_buffers(k)):
                    dst.scatter(src.gather())
        self.slots = [
            {c.name: start_slots(c.gather(), cfg.outer_optimizer) for c in self.comps[k]} if cfg.uses_bmuf else {}
            for k in range(n)
        ]
        # sync.exchange_dtype int8 / int4: every worker's references and residuals (quantize.coded_state)
        self.codec = codec_of(cfg) if cfg.spec.simulator == "periodic" else None
        ring = isinstance(self.topology, RingTopology)
        self.coded = [{c.name: coded_state(c.gather(), n, self.topology.neighbours(k) if ring else None, cfg.quant_ring,
                                           full=not ring or cfg.warmup_steps > 0)
                       for c in self.comps[k]} for k in range(n)] if self.codec is not None and n > 1 else []
        self.alpha = cfg.resolved_alpha(n)
        # EASGD / ASGD: the server's centre variable (global model), per component
        self.centre = [c.gather().clone() for c in self.comps[0]] if cfg.spec.family == "server" else []
        # ASGD: the model each worker last pulled
        self.pulled = ([[c.gather().clone() for c in comps] for comps in self.comps]
                       if cfg.spec.rule == "asgd" else [])
        self.round = 0  # ADPSGD: sync steps so far
        # sync.nonfinite: the same detection/exclusion/reset as the Synchronizer (gossip_accel/sync/health.py)
        self.reset_events: list[health.ResetEvent] = []
        self.on_reset: Optional[Callable[[int, list[str]], None]] = None  # (rank, parameter names)
        self.nonfinite_dropped = [0] * n
        self.pending = None  # delay-by-one: (component indices, pairs, {k: {ci: sent model}})
        # overlap: (apply_at, ci, event, snapshots, the int8/int4 ring payloads or None)
        self.inflight: list[tuple[int, int, Any, list[torch.Tensor], Optional[dict]]] = []

    def _with_buffers(self, k: int):
        return self.comps[k] + ([self.bufs[k]] if self.bufs[k] is not None else [])

    def _averages(self, thetas: list[torch.Tensor], kind: str, ci: int, round_: int,
                  payloads: Optional[dict] = None) -> list[tuple[torch.Tensor, str, bool]]:
        """(theta_bar, rule, reset?) for every worker: the global mean, or Algorithm 1 line 8 on the ring; with
        ``sync.nonfinite`` non-finite replicas are left out and reset (gossip_accel/sync/health.py). int8/int4
        ring: the ``payloads`` of :meth:`_ring_send` (coded at the post step; now when not given)."""
        name = self.comps[0][ci].name
        slots_bad = [health.slots_sick(self.slots[k].get(name)) for k in range(self.n)]
        if kind != "sync" or not isinstance(self.topology, RingTopology):
            mean, sick = self._healthy_mean(thetas, [self.comps[k][ci] for k in range(self.n)])
            if self.coded:
                mean = self._coded_full_mean(thetas, name, sick)
            elif is_low(self.wire):  # a sick replica sends zeros on the wire; the mean is rescaled by n / healthy
                mean = simulated_full_mean([torch.zeros_like(t) if s else t for t, s in zip(thetas, sick)], self.wire)
                if any(sick):
                    mean.mul_(self.n / sick.count(False))
            return [(mean.clone(), "warmup_end" if sick[k] and slots_bad[k] else kind, sick[k]) for k in range(self.n)]
        plan = self.topology.plan(ci, round_)
        if self.coded and payloads is None:
            payloads = self._ring_send(thetas, ci, round_)
        out = []
        for k in range(self.n):
            bar = torch.empty_like(thetas[k])  # <- the mean of thetas[k] (only read: an overlapped sync's snapshot)
            received = (ring_receive(self.codec, self.coded[k][name], plan.recv_from[k],
                                     [payloads[j, k] for j in plan.recv_from[k]], bar.numel(), self.cfg.quant_ring)
                        if self.coded else
                        [wire_round(thetas[j], self.wire) if is_low(self.wire) else thetas[j] for j in plan.recv_from[k]])
            dropped, source = neighbour_mean(self.cfg.nonfinite, k, self.t, name, bar, received, plan.recv_from[k],
                                             slots_bad[k], own=thetas[k])
            self.nonfinite_dropped[k] += dropped
            if source is not None:
                self._record(k, self.comps[k][ci], source)
            out.append((bar, kind if source is None else "warmup_end", source is not None))
        return out

    def _coded_full_mean(self, thetas: list[torch.Tensor], name: str, sick: list[bool]) -> torch.Tensor:
        """theta_bar of the int8/int4 all-reduce (Communicator.allreduce_mean_coded): ref + (n / healthy) x the
        decoded mean of the workers' quantized outer gradients theta_k - ref (sick workers send zeros)."""
        states = [self.coded[k][name] for k in range(self.n)]
        ref = states[0]["ref"]
        mean = simulated_coded_mean(self.codec, [t - ref for t in thetas], [st["residual"] for st in states],
                                    [st["owner"] for st in states], sick)
        healthy = sick.count(False)
        if healthy < self.n:
            mean.mul_(self.n / healthy)
        mean.add_(ref)
        self._coded_follows = healthy == self.n
        if healthy < self.n:  # engines/coded.py: the shared reference becomes theta_bar
            for st in states:
                st["ref"].copy_(mean)
        return mean

    def _ring_send(self, thetas: list[torch.Tensor], ci: int, round_: int) -> dict[tuple[int, int], torch.Tensor]:
        """Every worker j's int8/int4 messages of gossip round ``round_`` coded from ``thetas`` (quantize.ring_send,
        as engines/coded.py: the senders' copies / residuals change now): (j, receiver) -> payload."""
        name, plan = self.comps[0][ci].name, self.topology.plan(ci, round_)
        out = {}
        for j in range(self.n):
            sent = ring_send(self.codec, thetas[j], self.coded[j][name], plan.send_to[j], self.cfg.quant_ring)
            for i, dst in enumerate(plan.send_to[j]):  # params: one payload for every receiver
                out[j, dst] = sent[i if self.cfg.quant_ring == "copies" else 0]
        return out

    def _healthy_mean(self, vals: list[torch.Tensor], comps: list) -> tuple[torch.Tensor, list[bool]]:
        """The full-graph mean over the healthy replicas (value and BMUF slots finite); the sick ones are
        recorded as reset and returned with the mean. Same verdict and errors as the Synchronizer's flag all-reduce."""
        sick = [False] * self.n
        if self.cfg.nonfinite != "ignore":
            sick = [any(health.replica_sick(v, self.slots[k].get(comps[k].name))) for k, v in enumerate(vals)]
            health.Verdict([comps[0].name], [[s] for s in sick]).check(self.cfg.nonfinite, self.t)
        if not any(sick):
            return torch.stack(vals).mean(0), sick
        for k in range(self.n):
            if sick[k]:
                self._record(k, comps[k], f"the average of the {sick.count(False)} healthy ranks")
        return health.masked_mean(vals, sick), sick

    def _record(self, k: int, comp, source: str) -> None:
        """Worker k's ``comp`` was reset to ``source`` (worker.record_reset, as in the engines)."""
        on_reset = (lambda names: self.on_reset(k, names)) if self.on_reset is not None else None
        record_reset(self.reset_events, on_reset, k, self.t, comp, source, is_buffers=comp is self.bufs[k])

    def step(self) -> None:
        """All replicas have taken their local step t; synchronize what is due (lines 6-17)."""
        self.t += 1
        if self.n == 1 or not self.cfg.enabled:
            return
        cfg = self.cfg
        if cfg.spec.simulator != "periodic":
            due = [ci for ci, c in enumerate(self.comps[0])
                   if event_at(self.t, c.period, cfg.warmup_steps, cfg.warmup_period, warmup_kind=cfg.warmup_kind) is not None]
            if due:
                (self._server_step if cfg.spec.simulator == "server" else self._adpsgd_step)(due)
            if self.bufs[0] is not None and event_at(self.t, self.bufs[0].period, cfg.warmup_steps, cfg.warmup_period, warmup_kind=cfg.warmup_kind):
                self._sync_buffers()
            return
        self._apply_inflight(self.t)
        for ci, comp0 in enumerate(self.comps[0]):
            ev = event_at(self.t, comp0.period, cfg.warmup_steps, cfg.warmup_period, comp0.offset, cfg.warmup_kind)
            if ev is None:
                continue
            if ev.kind == "restart":  # the end of a gradient warm-up (warmup.py): the replicas are equal
                for k in range(self.n):
                    restart_slots(self.comps[k][ci], self.slots[k].get(comp0.name))
                continue
            thetas = [self.comps[k][ci].gather().clone() for k in range(self.n)]
            if cfg.overlap_steps > 0 and ev.kind == "sync":  # posted now, applied at t + tau
                self._check_full_graph(thetas, ci)
                ring = bool(self.coded) and isinstance(self.topology, RingTopology)  # int8/int4: coded now, decoded then
                self.inflight.append((self.t + cfg.overlap_steps, ci, ev, thetas,
                                      self._ring_send(thetas, ci, ev.round) if ring else None))
            else:
                self._apply_averages(ci, ev, thetas)
            if cfg.inner_state != "keep" and ev.kind in AVERAGING_EVENTS:
                self._inner_state(ci, ev.kind, ev.round)
        if self.bufs[0] is not None and event_at(self.t, self.bufs[0].period, cfg.warmup_steps, cfg.warmup_period,
                                                 warmup_kind=cfg.warmup_kind):
            self._sync_buffers()

    def _apply_averages(self, ci: int, ev: Any, thetas: list[torch.Tensor], overlapped: bool = False,
                        payloads: Optional[dict] = None) -> None:
        """Every worker's rule on its average of ``thetas``; overlapped: merged with its live model."""
        cfg = self.cfg
        self._coded_follows = False  # int8/int4 (set by _averages)
        for k, (bar, kind, reset) in enumerate(self._averages(thetas, ev.kind, ci, ev.round, payloads)):
            name = self.comps[k][ci].name
            new = new_local_model(kind, bar, self.slots[k].get(name), self.block_momentum, cfg.block_lr, cfg.nesterov)
            if self._coded_follows:  # int8/int4: the new model is the next block's reference
                self.coded[k][name]["ref"].copy_(new)
            comp = self.comps[k][ci]
            if not overlapped:
                comp.scatter(new)
            else:
                merge_component_(comp, thetas[k], new, cfg.overlap_merge, cfg.overlap_mix, reset)

    def _apply_inflight(self, t: Optional[int]) -> None:
        """The overlapped syncs due at step t (all when t is None: before the final average), in post order."""
        due = [f for f in self.inflight if t is None or f[0] == t]
        self.inflight = [f for f in self.inflight if not (t is None or f[0] == t)]
        for _, ci, ev, thetas, payloads in due:
            self._apply_averages(ci, ev, thetas, overlapped=True, payloads=payloads)

    def _check_full_graph(self, thetas: list[torch.Tensor], ci: int) -> None:
        """An overlapped full-graph sync: the engine's flag all-reduce at the post step raises per the policy."""
        if self.cfg.nonfinite == "ignore" or isinstance(self.topology, RingTopology):
            return
        name = self.comps[0][ci].name
        sick = [any(health.replica_sick(v, self.slots[k].get(name))) for k, v in enumerate(thetas)]
        health.Verdict([name], [[s] for s in sick]).check(self.cfg.nonfinite, self.t)

    def _inner_state(self, ci: int, kind: str, round_: int) -> None:
        """sync.inner_state (inner_state.py) for component ci: every replica's state reset, or averaged as its
        parameters were: the full mean, or with the ring neighbours of the round, on the same wire."""
        slices = [state_slices(self.comps[k][ci], [self.optimizers[k]]) for k in range(self.n)]
        if self.cfg.inner_state == "reset":
            for sl in slices:
                reset_(sl)
            return
        states = [as_component(self.comps[k][ci], slices[k], None) for k in range(self.n)]
        flats = [s.gather().clone() for s in states]
        if kind != "sync" or not isinstance(self.topology, RingTopology):
            mean = simulated_full_mean(flats, self.wire) if is_low(self.wire) else torch.stack(flats).mean(0)
            for s in states:
                s.scatter(mean)
            return
        recv_from = self.topology.plan(ci, round_).recv_from
        for k, s in enumerate(states):
            bar = flats[k].clone()
            neighbour_mean_(bar, [wire_round(flats[j], self.wire) if is_low(self.wire) else flats[j]
                                  for j in recv_from[k]], check=False)
            s.scatter(bar)

    def allreduce_gradients(self) -> None:
        """sync.warmup_kind=gradients: call between the replicas' backward and their optimizer steps;
        during the warm-up (the coming step t + 1 <= W) every replica's gradient <- the replicas' mean."""
        cfg = self.cfg
        if self.n > 1 and cfg.enabled and needs_gradient_allreduce(self.t + 1, cfg.warmup_steps, cfg.warmup_kind):
            mean_gradients_([list(m.parameters()) for m in self.models])

    def _server_step(self, due: list[int]) -> None:
        """EASGD eq. 8 (all at once) or eq. 9 / ASGD eq. 2 (pushes in rank order) on the due components."""
        spec, n, alpha = self.cfg.spec, self.n, self.alpha
        check = self.cfg.nonfinite != "ignore"
        for ci in due:
            centre = self.centre[ci]
            xs = [self.comps[k][ci].gather().clone() for k in range(n)]
            sick = [check and not health.all_finite(x) for x in xs]
            if not spec.asynchronous:  # eq. 8: the sick send zeros, sum and n over the healthy; they restart from w~_t
                if check:
                    health.Verdict([self.comps[0][ci].name], [[s] for s in sick]).check(self.cfg.nonfinite, self.t)
                total = torch.stack([x for x, s in zip(xs, sick) if not s]).sum(0)
                for k in range(n):
                    self._serve(k, ci, easgd_sync_worker(xs[k], centre, alpha, sick[k]), xs[k])
                elastic_center_update_sync(centre, total, n - sum(sick), alpha)
                continue
            for k in range(n):  # the pushes in rank order (lock-step): the server's push, the worker's reply
                name = self.comps[k][ci].name
                if spec.rule == "easgd":
                    old = centre.clone()
                    server_push(spec.rule, centre, xs[k], alpha, self.cfg.server_lr, check)
                    source = server_reply(spec.rule, self.cfg.nonfinite, k, self.t, name, xs[k], old, alpha)
                else:
                    server_push(spec.rule, centre, asgd_delta(xs[k], self.pulled[k][ci]), alpha, self.cfg.server_lr,
                                check)
                    source = server_reply(spec.rule, self.cfg.nonfinite, k, self.t, name, xs[k], centre, alpha,
                                          self.pulled[k][ci])
                self._serve(k, ci, source, xs[k])

    def _serve(self, k: int, ci: int, source: Optional[str], x: torch.Tensor) -> None:
        """Worker k's component ci after the server's reply: recorded if it was reset, written back."""
        if source is not None:
            self._record(k, self.comps[k][ci], source)
        self.comps[k][ci].scatter(x)

    def _adpsgd_step(self, due: list[int]) -> None:
        """Each pair of round r averages (fixed / random); delay-by-one applies round r at round r + 1."""
        self.round += 1
        pairs = self.topology.pairs(self.round)
        if not self.cfg.spec.delayed:
            for ci in due:
                for a, b in pairs:
                    xa, xb = self.comps[a][ci].gather().clone(), self.comps[b][ci].gather().clone()
                    self._pair(a, ci, xa.clone(), xb, f"the model of its partner rank {b}")
                    self._pair(b, ci, xb, xa, f"the model of its partner rank {a}")
            return
        self._resolve_delayed()
        sent = {k: {ci: self.comps[k][ci].gather().clone() for ci in due} for k in range(self.n)}
        self.pending = (due, pairs, sent)

    def _pair(self, k: int, ci: int, x: torch.Tensor, other: torch.Tensor, partner: str,
              sent: Optional[torch.Tensor] = None) -> None:
        """Worker k's pairwise average (worker.pair_merge, as in the engine), written back."""
        dropped, source = pair_merge(self.cfg.nonfinite, k, self.t, self.comps[k][ci].name, x, other, partner, sent)
        self.nonfinite_dropped[k] += dropped
        if source is not None:
            self._record(k, self.comps[k][ci], source)
        self.comps[k][ci].scatter(x)

    def _resolve_delayed(self) -> None:
        if self.pending is None:
            return
        due, pairs, sent = self.pending
        partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}
        for k in range(self.n):
            for ci in due:
                x = self.comps[k][ci].gather().clone()
                self._pair(k, ci, x, sent[partner[k]][ci], "its partner's model of the previous round", sent[k][ci])
        self.pending = None

    def _sync_buffers(self) -> None:
        vals = [b.gather().clone() for b in self.bufs]
        if self.cfg.buffers == "average":
            new = self._healthy_mean(vals, self.bufs)[0]
        else:  # broadcast from the lowest healthy rank
            sick = [self.cfg.nonfinite != "ignore" and not health.all_finite(v) for v in vals]
            health.Verdict([self.bufs[0].name], [[s] for s in sick]).check(self.cfg.nonfinite, self.t)
            src = sick.index(False) if False in sick else 0
            for k in range(self.n):
                if sick[k] and k != src:
                    self._record(k, self.bufs[k], f"the buffers of rank {src}")
            new = vals[src]
        for b in self.bufs:
            b.scatter(new)

    def finalize(self) -> None:
        """Every replica <- the average of all replicas (Algorithm 1, line 20)."""
        if self.n == 1 or not self.cfg.enabled:
            return
        if self.cfg.spec.family == "server":
            # EASGD's output is the centre variable; ASGD first pushes the steps since the last pull
            for ci, centre in enumerate(self.centre):
                if self.cfg.spec.rule == "asgd":
                    for k in range(self.n):
                        delta = asgd_delta(self.comps[k][ci].gather().clone(), self.pulled[k][ci])
                        server_push(self.cfg.spec.rule, centre, delta, self.alpha, self.cfg.server_lr,  # the server rejects NaN
                                    self.cfg.nonfinite != "ignore")
                for k in range(self.n):
                    self.comps[k][ci].scatter(centre)
            if self.bufs[0] is not None:
                self._sync_buffers()
            return
        self._resolve_delayed()
        self._apply_inflight(None)
        for ci in range(len(self.comps[0])):
            mean = self._healthy_mean([self.comps[k][ci].gather().clone() for k in range(self.n)],
                                      [self.comps[k][ci] for k in range(self.n)])[0]
            for k in range(self.n):
                self.comps[k][ci].scatter(mean)
        if self.bufs[0] is not None:
            self._sync_buffers()


class HierarchicalCluster:
    """The oracle of :class:`gossip_accel.sync.hierarchical.HierarchicalSynchronizer`: W = G g rank replicas.

    Ranks k = j g .. j g + g - 1 form group j. :meth:`allreduce_gradients` sets every rank's
    gradient to its group's mean (the intra-group all-reduce, called between backward and the
    optimizer step); :meth:`step` is the between-group synchronization, exactly the flat
    :class:`SimulatedCluster` with n = G on the groups' first ranks, whose result the other ranks
    of the group copy (the carrier's broadcast); the float buffers are first averaged (or taken
    from local rank 0) inside each group, then synchronized between groups by the flat policy.
    """

    def __init__(self, models: Sequence[torch.nn.Module], config: Any = None, overrides: Sequence[str] = (),
                 group_size: Optional[int] = None):
        cfg = load_sync_config(config, overrides)
        self.models = list(models)
        world = len(self.models)
        self.g = g = group_size or cfg.hierarchy.resolved_group_size(world)
        check_group_size(g, world, "HierarchicalCluster group_size", groups_needed=True)
        self.groups = world // g
        self.comps = [split_components(m.named_parameters(), cfg.components, cfg.period) for m in self.models]
        period = min(c.period for c in self.comps[0])
        self.bufs = [split_buffers(m.named_buffers(), period) if cfg.buffers != "local" else None for m in self.models]
        if cfg.enabled and cfg.broadcast_initial:  # rank 0's theta_0 everywhere (Algorithm 1, line 1)
            for k in range(1, world):
                self._copy(0, k, buffers=True)
        self.inner = SimulatedCluster(self.models[::g], cfg)
        self.cfg = self.inner.cfg

    def _copy(self, src: int, dst: int, buffers: bool) -> None:
        for a, b in zip(self.comps[src], self.comps[dst]):
            b.scatter(a.gather())
        if buffers and self.bufs[src] is not None:
            self.bufs[dst].scatter(self.bufs[src].gather())

    def _members(self, j: int) -> range:
        return range(j * self.g, (j + 1) * self.g)

    @torch.no_grad()
    def allreduce_gradients(self) -> None:
        """Every rank's .grad <- the mean over its group (summed in rank order, then divided by g)."""
        for j in range(self.groups):
            mean_gradients_([list(self.models[k].parameters()) for k in self._members(j)])

    def _group_buffers(self) -> None:
        for j in range(self.groups):
            members = list(self._members(j))
            vals = [self.bufs[k].gather().clone() for k in members]
            new = vals[0]
            if self.cfg.buffers == "average":
                for v in vals[1:]:
                    new.add_(v)
                new.div_(self.g)
            for k in members:
                self.bufs[k].scatter(new)

    def _share(self, buffers: bool) -> None:
        for j in range(self.groups):
            for k in list(self._members(j))[1:]:
                self._copy(j * self.g, k, buffers)

    def step(self) -> None:
        """Every rank has taken its local step t (with the group's mean gradient): lines 6-17 between groups."""
        cfg = self.cfg
        buffers_due = (self.bufs[0] is not None and cfg.enabled and
                       event_at(self.inner.t + 1, self.bufs[0].period, cfg.warmup_steps, cfg.warmup_period,
                                warmup_kind=cfg.warmup_kind) is not None)
        if buffers_due:
            self._group_buffers()
        self.inner.step()
        self._share(buffers_due)

    def finalize(self) -> None:
        """Line 20: every rank <- the mean of the groups' models (= of all W ranks)."""
        if self.bufs[0] is not None and self.cfg.enabled:
            self._group_buffers()
        self.inner.finalize()
        self._share(buffers=True)


def simulate(
    model_fn: Callable[[], torch.nn.Module],
    optimizer_fn: Callable[[torch.nn.Module], torch.optim.Optimizer],
    local_step: Callable[[torch.nn.Module, torch.optim.Optimizer, int, int], float],
    n: int,
    steps: int,
    config: Any = None,
    overrides: Sequence[str] = (),
    finalize: bool = True,
    on_step: Optional[Callable[[int, list[float], SimulatedCluster], None]] = None,
) -> SimulatedCluster:
    """Train n replicas for ``steps`` steps; ``local_step(model, opt, rank, t)`` returns a loss."""
    models = [model_fn() for _ in range(n)]
    opts = [optimizer_fn(m) for m in models]
    if load_sync_config(config, overrides).warmup_kind == "gradients":
        raise ConfigError("simulate(): local_step takes the optimizer step, so the gradients cannot be averaged "
                          "before it (sync.warmup_kind=gradients); drive SimulatedCluster with allreduce_gradients()")
    cluster = SimulatedCluster(models, config, overrides, optimizers=opts)
    # a reset replica forgets the optimizer state of its reset parameters (as DistributedRun does)
    cluster.on_reset = lambda k, names: health.clear_optimizer_state(opts[k], models[k], names)
    for t in range(1, steps + 1):
        losses = [local_step(models[k], opts[k], k, t) for k in range(n)]
        cluster.step()
        if on_step is not None:
            on_step(t, losses, cluster)
    if finalize:
        cluster.finalize()
    return cluster


def _divergence(cluster: SimulatedCluster) -> float:
    flats = [torch.cat([c.gather().clone() for c in comps]) for comps in cluster.comps]
    mean = torch.stack(flats).mean(0)
    return float(sum(torch.linalg.vector_norm(f - mean) for f in flats) / len(flats) / torch.linalg.vector_norm(mean))


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Compare the algorithms on the toy task; prints a table and optionally writes JSON."""
    from . import toy

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("overrides", nargs="*", help="sync.* dotlist overrides, e.g. sync.period=8")
    args = ap.parse_args(argv)
    rows = []
    for algo in args.algorithms.split(","):
        div: list[float] = []
        cluster = simulate(
            toy.ToyModel, lambda m: torch.optim.SGD(m.parameters(), lr=args.lr),
            lambda m, o, k, t: toy.train_step(m, o, 0, k, t), args.workers, args.steps,
            {"components": toy.TOY_COMPONENTS, "period": 4},
            [f"sync.algorithm={algo}", *args.overrides], finalize=False,
            on_step=lambda t, losses, c: div.append(_divergence(c)) if t % 10 == 0 else None,
        )
        before = _divergence(cluster)
        cluster.finalize()
        rows.append({"algorithm": algo, "heldout_mse": toy.heldout_loss(cluster.models[0]),
                     "mean_divergence": sum(div) / max(len(div), 1), "divergence_before_final": before})
    print(f"{'algorithm':<14}{'held-out MSE':>14}{'mean divergence':>18}")
    for r in rows:
        print(f"{r['algorithm']:<14}{r['heldout_mse']:>14.4f}{r['mean_divergence']:>18.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workers": args.workers, "steps": args.steps, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
