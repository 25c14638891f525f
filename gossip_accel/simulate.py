"""The oracle: n workers simulated in ONE process with plain tensors.

It uses the same components, schedule, topology and update-rule code as the
:class:`~gossip_accel.sync.Synchronizer`, but no torch.distributed: averages are computed
directly from the n replicas. A distributed run with the same seeds and data must end with
the same parameters (tests/test_distributed_equals_simulator.py).

The asynchronous algorithms (ASGD, async EASGD, ADPSGD) are simulated in their deterministic
lock-step order (``sync.lockstep: true`` in a distributed run): the server takes the pushes
of a round in rank order; ADPSGD's partners average exactly.

CLI: ``gossip-simulate --workers 8 --steps 400`` (or ``python -m gossip_accel.simulate``)
compares the algorithms on the toy task of :mod:`gossip_accel.toy` and prints a table.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Optional, Sequence

import torch

from .algorithms import (
    BMUFSlots,
    asgd_delta,
    asgd_server_update,
    delayed_average,
    elastic_center_update_sync,
    elastic_worker_update,
    new_local_model,
    pair_average,
)
from .components import split_buffers, split_components
from .config import ADPSGD_ALGORITHMS, ALGORITHMS, SERVER_ALGORITHMS, load_sync_config, validate_for_world
from .schedule import event_at
from .topology import RingTopology, make_topology


class SimulatedCluster:
    """n replicas of a model and the synchronization of Algorithm 1 among them."""

    def __init__(self, models: Sequence[torch.nn.Module], config: Any = None, overrides: Sequence[str] = ()):
        self.cfg = load_sync_config(config, overrides)
        self.models = list(models)
        self.n = n = len(self.models)
        cfg = self.cfg
        validate_for_world(cfg, n)
        self.comps = [split_components(m.named_parameters(), cfg.components, cfg.period) for m in self.models]
        period = min(c.period for c in self.comps[0])
        self.bufs = [split_buffers(m.named_buffers(), period) if cfg.buffers != "local" else None for m in self.models]
        self.topology = make_topology(cfg.algorithm, n, cfg.resolved_p(n), cfg.resolved_q(n), cfg.seed) if n > 1 else None
        self.block_momentum = cfg.resolved_block_momentum(n)
        self.t = 0
        if cfg.enabled and cfg.broadcast_initial:
            for k in range(1, n):
                for src, dst in zip(self._with_buffers(0), self._with_buffers(k)):
                    dst.scatter(src.gather())
        self.slots = [
            {c.name: BMUFSlots.start_from(c.gather()) for c in self.comps[k]} if cfg.uses_bmuf else {}
            for k in range(n)
        ]
        self.alpha = cfg.resolved_alpha(n)
        # EASGD / ASGD: the server's centre variable (global model), per component
        self.centre = [c.gather().clone() for c in self.comps[0]] if cfg.algorithm in SERVER_ALGORITHMS else []
        # ASGD: the model each worker last pulled
        self.pulled = ([[c.gather().clone() for c in comps] for comps in self.comps]
                       if cfg.algorithm == "asgd" else [])
        self.round = 0  # ADPSGD: sync steps so far
        self.pending = None  # delay-by-one: (component indices, pairs, {k: {ci: sent model}})

    def _with_buffers(self, k: int):
        return self.comps[k] + ([self.bufs[k]] if self.bufs[k] is not None else [])

    def _averages(self, thetas: list[torch.Tensor], kind: str, ci: int, round_: int) -> list[torch.Tensor]:
        """theta_bar for every worker: the global mean, or Algorithm 1 line 8 on the ring."""
        if kind != "sync" or not isinstance(self.topology, RingTopology):
            mean = torch.stack(thetas).mean(0)
            return [mean.clone() for _ in thetas]
        plan = self.topology.plan(ci, round_)
        bars = []
        for k in range(self.n):
            bar = thetas[k].clone()
            for j in plan.recv_from[k]:
                bar.add_(thetas[j])
            bars.append(bar.div_(len(plan.recv_from[k]) + 1))
        return bars

    def step(self) -> None:
        """All replicas have taken their local step t; synchronize what is due (lines 6-17)."""
        self.t += 1
        if self.n == 1 or not self.cfg.enabled:
            return
        cfg = self.cfg
        if cfg.algorithm in SERVER_ALGORITHMS or cfg.algorithm in ADPSGD_ALGORITHMS:
            due = [ci for ci, c in enumerate(self.comps[0])
                   if event_at(self.t, c.period, cfg.warmup_steps, cfg.warmup_period) is not None]
            if due:
                (self._server_step if cfg.algorithm in SERVER_ALGORITHMS else self._adpsgd_step)(due)
            if self.bufs[0] is not None and event_at(self.t, self.bufs[0].period, cfg.warmup_steps, cfg.warmup_period):
                self._sync_buffers()
            return
        for ci, comp0 in enumerate(self.comps[0]):
            ev = event_at(self.t, comp0.period, cfg.warmup_steps, cfg.warmup_period)
            if ev is None:
                continue
            thetas = [self.comps[k][ci].gather().clone() for k in range(self.n)]
            for k, bar in enumerate(self._averages(thetas, ev.kind, ci, ev.round)):
                slots = self.slots[k].get(comp0.name)
                new = new_local_model(ev.kind, bar, slots, self.block_momentum, cfg.block_lr, cfg.nesterov)
                self.comps[k][ci].scatter(new)
        if self.bufs[0] is not None and event_at(self.t, self.bufs[0].period, cfg.warmup_steps, cfg.warmup_period):
            self._sync_buffers()

    def _server_step(self, due: list[int]) -> None:
        """EASGD eq. 8 (all at once) or eq. 9 / ASGD eq. 2 (pushes in rank order) on the due components."""
        algo, n, alpha = self.cfg.algorithm, self.n, self.alpha
        for ci in due:
            centre = self.centre[ci]
            xs = [self.comps[k][ci].gather().clone() for k in range(n)]
            if algo == "easgd":
                total = torch.stack(xs).sum(0)
                for k in range(n):
                    self.comps[k][ci].scatter(elastic_worker_update(xs[k], centre, alpha))
                elastic_center_update_sync(centre, total, n, alpha)
                continue
            for k in range(n):
                if algo == "easgd_async":
                    old = centre.clone()
                    elastic_worker_update(centre, xs[k], alpha)
                    self.comps[k][ci].scatter(elastic_worker_update(xs[k], old, alpha))
                else:
                    asgd_server_update(centre, asgd_delta(xs[k], self.pulled[k][ci]), self.cfg.server_lr)
                    self.pulled[k][ci].copy_(centre)
                    self.comps[k][ci].scatter(centre)

    def _adpsgd_step(self, due: list[int]) -> None:
        """Each pair of round r averages (fixed / random); delay-by-one applies round r at round r + 1."""
        self.round += 1
        pairs = self.topology.pairs(self.round)
        if self.cfg.algorithm != "adpsgd_delay":
            for ci in due:
                for a, b in pairs:
                    xa, xb = self.comps[a][ci].gather().clone(), self.comps[b][ci].gather().clone()
                    self.comps[a][ci].scatter(pair_average(xa.clone(), xb))
                    self.comps[b][ci].scatter(pair_average(xb, xa))
            return
        self._resolve_delayed()
        sent = {k: {ci: self.comps[k][ci].gather().clone() for ci in due} for k in range(self.n)}
        self.pending = (due, pairs, sent)

    def _resolve_delayed(self) -> None:
        if self.pending is None:
            return
        due, pairs, sent = self.pending
        partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}
        for k in range(self.n):
            for ci in due:
                x = self.comps[k][ci].gather().clone()
                self.comps[k][ci].scatter(delayed_average(x, sent[k][ci], sent[partner[k]][ci]))
        self.pending = None

    def _sync_buffers(self) -> None:
        vals = [b.gather().clone() for b in self.bufs]
        new = torch.stack(vals).mean(0) if self.cfg.buffers == "average" else vals[0]
        for b in self.bufs:
            b.scatter(new)

    def finalize(self) -> None:
        """Every replica <- the average of all replicas (Algorithm 1, line 20)."""
        if self.n == 1 or not self.cfg.enabled:
            return
        if self.cfg.algorithm in SERVER_ALGORITHMS:
            # EASGD's output is the centre variable; ASGD first pushes the steps since the last pull
            for ci, centre in enumerate(self.centre):
                if self.cfg.algorithm == "asgd":
                    for k in range(self.n):
                        x = self.comps[k][ci].gather().clone()
                        asgd_server_update(centre, asgd_delta(x, self.pulled[k][ci]), self.cfg.server_lr)
                for k in range(self.n):
                    self.comps[k][ci].scatter(centre)
            if self.bufs[0] is not None:
                self._sync_buffers()
            return
        self._resolve_delayed()
        for ci in range(len(self.comps[0])):
            mean = torch.stack([self.comps[k][ci].gather().clone() for k in range(self.n)]).mean(0)
            for k in range(self.n):
                self.comps[k][ci].scatter(mean)
        if self.bufs[0] is not None:
            self._sync_buffers()


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
    cluster = SimulatedCluster(models, config, overrides)
    opts = [optimizer_fn(m) for m in models]
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
