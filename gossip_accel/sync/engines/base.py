"""The engine interface and the narrow context an engine is handed (never the Synchronizer itself).

An engine runs one family of algorithms (registry.py: ``Algorithm.engine``) for one worker:

* ``step(t, due, buffers_due)``: optimizer step t has been taken; ``due`` are the (component,
  schedule event) pairs whose sync is due (schedule.py), ``buffers_due`` says whether the float
  buffers are due as well;
* ``finalize()``: the end of training (Algorithm 1 line 20, or the server's model);
* ``close()``: leave after an error without waiting for the others;
* ``state_dict()`` / ``load_state_dict()``: what a restart needs besides the BMUF slots;
* ``metrics()`` / ``report()``: the engine's own counters.

:class:`EngineContext` is all an engine may use: the config and its registry entry, rank and world
size, the transport, the topology, the components and BMUF slots, the metrics sink, and the pieces
that every family shares and that a subclass of the Synchronizer may change (the hierarchical one:
which components this rank carries, how the new values are shared inside a group, what happens to
the float buffers first): health verdicts (one flag all-reduce), the masked full-graph mean, reset
recording, the final average and the buffer policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .. import health
from ..algorithms import Slots
from ..comm import CommStats, Communicator
from ..components import Component
from ..config import SyncConfig
from ..schedule import Event
from ..worker import record_reset

#: a component that is due now and its schedule event
Due = list[tuple[Component, Event]]


@dataclass
class SyncMetrics:
    """The metrics sink shared by the synchronizer and its engine: worker divergence per component,
    the resets of this rank, the dropped non-finite copies, the traffic of the non-finite flags."""

    divergence: dict[str, float] = field(default_factory=dict)
    reset_events: list[health.ResetEvent] = field(default_factory=list)
    nonfinite_dropped: int = 0
    health_stats: CommStats = field(default_factory=CommStats)


@dataclass
class EngineContext:
    """What an engine sees of the worker it runs on (module docstring)."""

    cfg: SyncConfig
    rank: int
    world_size: int
    comm: Optional[Communicator]
    group: Optional[dist.ProcessGroup]
    topology: Any
    components: list[Component]
    buffers: Optional[Component]
    slots: dict[str, Slots] = field(default_factory=dict)  # BMUF (omega, Delta) or outer-optimizer slots
    metrics: SyncMetrics = field(default_factory=SyncMetrics)
    t: int = 0
    #: callable(list of parameter names) after a reset, e.g. clear their optimizer state
    on_reset: Optional[Callable[[list[str]], None]] = None
    #: does this rank run the algorithm for a component? (flat: every rank, every component)
    carries: Callable[[Component], bool] = field(default=lambda comp: True)
    #: after a sync: hand the new values to the ranks that did not carry them (flat: nothing to do)
    share: Callable[[list[Component]], None] = field(default=lambda comps: None)
    #: before the buffers are synchronized between replicas (replica groups: inside the group first)
    before_buffers: Callable[[Component], None] = field(default=lambda buffers: None)
    wire_dtype: torch.dtype = torch.float32
    block_momentum: float = 0.0  # eta of the BMUF rule (config.resolved_block_momentum)
    #: int8/int4 wire: the references and residuals of engines/coded.py (set by the periodic engine)
    coded: Any = None

    @property
    def spec(self):
        return self.cfg.spec

    def carried(self) -> list[Component]:
        return [c for c in self.components if self.carries(c)]

    def wire(self, kind: str) -> Optional[torch.dtype]:
        """The wire dtype of an all-reduce: ``sync.exchange_dtype`` for the periodic syncs and warm-up
        averages; fp32 (None) for the one-off final average and the buffers."""
        return self.wire_dtype if kind in ("sync", "warmup", "warmup_end") else None

    # -- sync.nonfinite: a diverged replica is detected, excluded and reset (health.py) --------------
    def verdict(self, comps: list[Component]) -> Optional[health.Verdict]:
        """Gathers each of ``comps`` into its flat buffer (callers read ``comp.flat`` after it), then:
        who is sick among the ranks for each of them: ONE all-reduce of an (n, m) flag matrix
        (n * m * 4 bytes, counted in ``metrics.health_stats``). Raises per the policy; None with ``ignore``."""
        flats = [c.gather() for c in comps]
        if self.cfg.nonfinite == "ignore" or not comps:
            return None
        local = [any(health.replica_sick(flat, self.slots.get(c.name))) for c, flat in zip(comps, flats)]
        flags = health.flag_matrix(local, self.rank, self.world_size)
        with self.comm.accounting(self.metrics.health_stats):
            self.comm.allreduce_mean("nonfinite_flags", flags)
        verdict = health.Verdict.from_flags([c.name for c in comps], flags, scale=self.world_size)
        verdict.check(self.cfg.nonfinite, self.t)
        return verdict

    def record_reset(self, comp: Component, source: str) -> None:
        """This rank's ``comp`` was non-finite and was reset to ``source`` (worker.record_reset)."""
        record_reset(self.metrics.reset_events, self.on_reset, self.rank, self.t, comp, source,
                     is_buffers=comp is self.buffers)

    def masked_allreduce(self, comp: Component, kind: str, verdict: Optional[health.Verdict], j: int) -> str:
        """comp.flat <- the mean over the healthy ranks (sick ones send zeros): Algorithm 1 line 8 on the
        full graph without the diverged replicas. Returns the rule to apply: a sick rank whose own BMUF
        slots are non-finite restarts them (``warmup_end``); otherwise the shared slots stay consistent."""
        sick = verdict is not None and verdict.sick[self.rank][j]
        healthy = verdict.healthy(j) if verdict is not None else None
        if self.coded is not None and self.wire(kind) is not None:
            # int8/int4: the outer gradient (coded.py), already the mean over the healthy ranks
            self.coded.full_mean(self.comm, comp, sick, self.world_size if healthy is None else healthy)
            return self.masked_result(comp, comp.flat, kind, sick, healthy, rescale=False)
        if sick:
            comp.flat.zero_()
        self.comm.allreduce_mean(comp.name, comp.flat, self.wire(kind))
        return self.masked_result(comp, comp.flat, kind, sick, healthy)

    def masked_result(self, comp: Component, mean: torch.Tensor, kind: str, sick: bool, healthy: Optional[int],
                      rescale: bool = True) -> str:
        """``mean`` (the all-reduce mean, sick ranks sent zeros) <- the mean over the ``healthy`` ranks (``rescale``;
        a coded mean is over them already); a sick rank is recorded as reset. Returns the rule to apply
        (:meth:`masked_allreduce`)."""
        if healthy is None or healthy == self.world_size:
            return kind
        if rescale:
            mean.mul_(self.world_size / healthy)
        if not sick:
            return kind
        self.record_reset(comp, f"the average of the {healthy} healthy ranks")
        slots = self.slots.get(comp.name)
        return "warmup_end" if health.slots_sick(slots) else kind

    def average_all(self) -> None:
        """theta = (1/n) sum_k theta^k of every component (Algorithm 1, line 20), healthy ranks only."""
        carried = self.carried()
        verdict = self.verdict(carried)  # gathers them
        for j, comp in enumerate(carried):
            self.masked_allreduce(comp, "final", verdict, j)
            comp.scatter()
        self.share(self.components)

    def sync_buffers(self, verdict: Optional[health.Verdict] = None) -> None:
        """Average (or broadcast) the float buffers; a rank with non-finite buffers is left out of the
        average (broadcast: the lowest healthy rank sends). ``verdict`` (buffers last) saves a flag all-reduce."""
        comp = self.buffers
        self.before_buffers(comp)
        verdict = verdict if verdict is not None else self.verdict([comp])
        j = len(verdict.names) - 1 if verdict is not None else 0
        comp.gather()
        if self.cfg.buffers == "average":
            self.masked_allreduce(comp, "buffers", verdict, j)
        else:
            src = 0
            if verdict is not None and verdict.sick_ranks(j):
                src = min(k for k in range(self.world_size) if not verdict.sick[k][j])
                if verdict.sick[self.rank][j]:
                    self.record_reset(comp, f"the buffers of rank {src}")
            self.comm.broadcast(comp.name, comp.flat, src=src)
        comp.scatter()


class Engine:
    """The interface every engine implements (module docstring); built with ``Engine(ctx)``."""

    #: are the float buffers synchronized at their period during training? (RPC runs: only at the end,
    #: a buffer collective would lock-step the asynchronous workers)
    syncs_buffers_in_step = True

    def __init__(self, ctx: EngineContext):
        self.ctx = ctx

    def step(self, t: int, due: Due, buffers_due: bool) -> None:
        raise NotImplementedError

    def finalize(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """After an error: nothing is open by default."""

    def metrics(self) -> dict[str, float]:
        return {}

    def report(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore by default."""
