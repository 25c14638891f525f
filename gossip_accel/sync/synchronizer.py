"""The Synchronizer: periodic, per-component model synchronization (Algorithm 1).

Use it after every optimizer step::

    sync = Synchronizer(model, "conf/sync.yaml", overrides=["sync.period=8"])
    with sync:                       # exit = final average over all workers (line 20)
        for batch in loader:
            loss = model(batch); loss.backward(); opt.step(); opt.zero_grad()
            sync.step()              # lines 6-17 for every component that is due

Each worker trains its own replica (no gradient all-reduce); every H_i steps component i is
averaged over all workers (MA/BMUF) or over the node and q random ring neighbours
(gossip/local, Definition 1), then the update rule of ``sync.algorithm`` is applied. The
parameter-server algorithms (EASGD, ASGD: :mod:`gossip_accel.sync.engines.server`) and ADPSGD
(:mod:`gossip_accel.sync.engines.pairwise`) are engines behind the same three calls (``step``,
``finalize``, ``state_dict``); the asynchronous ones start a torch.distributed.rpc session
with the synchronizer and end it in ``finalize`` (or ``close`` after an error). For
Accelerate's DDP-wrapped models use :class:`gossip_accel.sync.integrations.accelerate.AccelerateSynchronizer`,
which also switches off DDP's gradient all-reduce. Groups of ranks that all-reduce gradients
every step and synchronize between groups (``sync.hierarchy``) are the subclass
:class:`gossip_accel.sync.hierarchical.HierarchicalSynchronizer`; ``sync.exchange_dtype`` puts the
periodic syncs on a bf16/fp16 wire (:mod:`gossip_accel.sync.precision`).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from . import health
from .algorithms import BMUFSlots, new_local_model
from .comm import CommStats, Communicator, Exchange
from .precision import is_low, wire_dtype
from .components import Component, split_buffers, split_components
from .config import ConfigError, SyncConfig, load_sync_config, validate_for_world
from .schedule import event_at
from .topology import RingTopology, make_topology

STATE_VERSION = 1


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP / torch.compile wrappers (parameter names without ``module.``)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
        else:
            return model


def broadcast_components(comm: Communicator, comps: Sequence[Component],
                         src: Callable[[Component], int] = lambda comp: 0) -> None:
    """Every rank of ``comm``'s group <- rank ``src(comp)``'s value of each of ``comps``."""
    for comp in comps:
        comp.gather()
        comm.broadcast(comp.name, comp.flat, src=src(comp))
        comp.scatter()


class Synchronizer:
    """Owns components, BMUF slots, receive buffers and the step counter of one worker.

    Memory: BMUF keeps two fp32 slots (omega, Delta) of the model's size, on the parameters'
    device or on the CPU with ``sync.slots_on_cpu``; gossip/local keep q receive buffers per
    component; every component has one flat work buffer. All are allocated here, once.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: Any = None,
        overrides: Sequence[str] = (),
        process_group: Optional[dist.ProcessGroup] = None,
    ):
        self.cfg: SyncConfig = load_sync_config(config, overrides)
        self.model = unwrap_model(model)
        self.components: list[Component] = split_components(
            self.model.named_parameters(), self.cfg.components, self.cfg.period
        )
        self.buffers: Optional[Component] = None
        if self.cfg.buffers != "local":
            self.buffers = split_buffers(
                self.model.named_buffers(), min(c.period for c in self.components)
            )
        self.t = 0
        self.finalized = False
        self.divergence: dict[str, float] = {}
        # sync.nonfinite (gossip_accel/sync/health.py): resets of this rank, dropped NaN copies, flag traffic
        self.reset_events: list[health.ResetEvent] = []
        self.on_reset: Optional[Any] = None  # callable(list of parameter names), e.g. clear their optimizer state
        self.nonfinite_dropped = 0
        self.health_stats = CommStats()

        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size(process_group) if distributed else 1
        self.rank = dist.get_rank(process_group) if distributed else 0
        self.active = self.cfg.enabled and self.world_size > 1
        if self.cfg.enabled and self.world_size == 1:
            warnings.warn(
                "gossip_accel: a single process (world size 1): nothing to synchronize, "
                "training is plain local training",
                stacklevel=2,
            )
        self.block_momentum = self.cfg.resolved_block_momentum(self.world_size)
        self.slots: dict[str, BMUFSlots] = {}
        self._staging: dict[str, torch.Tensor] = {}
        self._recv: dict[str, list[torch.Tensor]] = {}
        self.engine = None  # EASGD/ASGD (param_server.ServerEngine) or ADPSGD (pairwise.PairwiseEngine)
        self.wire_dtype = wire_dtype(self.cfg.exchange_dtype)  # sync.exchange_dtype (precision.py)
        self._send: dict[str, torch.Tensor] = {}  # ring: the wire-dtype copy a node sends
        if not self.active:
            self.comm = None
            self.topology = None
            return

        validate_for_world(self.cfg, self.world_size)
        self.comm = Communicator(process_group)
        # the initial broadcast and the final average are one-offs, kept out of the per-step counters
        self.oneoff_stats = CommStats()
        n = self.world_size
        self.topology = make_topology(
            self.cfg.algorithm, n, self.cfg.resolved_p(n), self.cfg.resolved_q(n), self.cfg.seed
        )
        if self.cfg.broadcast_initial:  # Algorithm 1, line 1: theta_0^k <- theta_0
            self._broadcast_initial()
        slot_device = torch.device("cpu") if self.cfg.slots_on_cpu else None
        for comp in self._carried():
            if self.cfg.uses_bmuf:
                self.slots[comp.name] = BMUFSlots.start_from(comp.gather(), slot_device)
                if self.slots[comp.name].omega.device != comp.flat.device:
                    self._staging[comp.name] = torch.empty_like(self.slots[comp.name].omega)
            if isinstance(self.topology, RingTopology):
                self._recv[comp.name] = [torch.empty_like(comp.flat, dtype=self.wire_dtype)
                                         for _ in range(self.topology.q)]
                if is_low(self.wire_dtype):
                    self._send[comp.name] = torch.empty_like(comp.flat, dtype=self.wire_dtype)
        if self.cfg.spec.engine == "server":
            from .engines.server import ServerEngine

            self.engine = ServerEngine(self, process_group)
        elif self.cfg.spec.engine == "pairwise":
            from .engines.pairwise import PairwiseEngine

            self.engine = PairwiseEngine(self, process_group)

    # -- the training-loop API -------------------------------------------------------------
    def step(self) -> None:
        """Call once per optimizer step: synchronizes the components that are due."""
        self.t += 1
        if not self.active:
            return
        cfg = self.cfg
        due = []
        for comp in self.components:
            ev = event_at(self.t, comp.period, cfg.warmup_steps, cfg.warmup_period)
            if ev is not None:
                due.append((comp, ev))
        if self.engine is not None:
            if due:
                self.engine.step(due)
            # asynchronous runs would lock-step on a buffer collective: their buffers meet at finalize
            if (self.buffers is not None and not cfg.uses_rpc
                    and event_at(self.t, self.buffers.period, cfg.warmup_steps, cfg.warmup_period)):
                self._sync_buffers()
            return
        shared = [c for c, _ in due]
        due = [(c, e) for c, e in due if self._carries(c)]
        gossip = isinstance(self.topology, RingTopology)
        ring = [(c, e) for c, e in due if gossip and e.kind == "sync"]
        full = [(c, e) for c, e in due if not (gossip and e.kind == "sync")]
        buffers_due = self.buffers is not None and event_at(self.t, self.buffers.period, cfg.warmup_steps,
                                                            cfg.warmup_period)
        verdict = self._verdict([c for c, _ in full] + ([self.buffers] if buffers_due else []))
        for j, (comp, ev) in enumerate(full):  # _verdict gathered them
            kind = self._masked_allreduce(comp, ev.kind, verdict, j)
            self._apply(comp, kind)
        if ring:
            self._gossip_round(ring)
        self._share(shared)
        if buffers_due:
            self._sync_buffers(verdict)

    def finalize(self) -> None:
        """theta = (1/n) sum_k theta_T^k (Algorithm 1, line 20): every replica ends equal.

        EASGD and ASGD end with the server's model (the centre variable, the global model)
        instead; ADPSGD first applies what is pending. Asynchronous runs close RPC here.
        """
        if self.active and not self.finalized:
            with self.comm.accounting(self.oneoff_stats):
                if self.engine is not None:
                    self.engine.finalize()
                else:
                    self._average_all_components()
                if self.buffers is not None:
                    self._sync_buffers()
        self.finalized = True

    def close(self) -> None:
        """After an error: leave an RPC session without waiting for the other workers."""
        if self.engine is not None:
            self.engine.close()

    def __enter__(self) -> "Synchronizer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.close()

    def report(self) -> dict:
        """Counters of the asynchronous algorithms (pushes, staleness, server view, requests served)."""
        return self.engine.report() if self.engine is not None else {}

    # -- internals -----------------------------------------------------------------------
    def _average_all_components(self) -> None:
        carried = self._carried()
        verdict = self._verdict(carried)  # gathers them
        for j, comp in enumerate(carried):
            self._masked_allreduce(comp, "final", verdict, j)
            comp.scatter()
        self._share(self.components)

    def _broadcast_initial(self) -> None:
        """theta_0^k <- theta_0 of rank 0 (Algorithm 1, line 1), counted as a one-off."""
        with self.comm.accounting(self.oneoff_stats):
            broadcast_components(self.comm, self._all_components())

    # -- what a subclass changes (gossip_accel/sync/hierarchical.py) -----------------------------------
    def _carries(self, comp: Component) -> bool:
        """Does this rank run the algorithm for ``comp``? (Flat: every rank, every component.)"""
        return True

    def _carried(self) -> list[Component]:
        return [c for c in self.components if self._carries(c)]

    def _share(self, comps: list[Component]) -> None:
        """After a sync of ``comps``: hand the new values to the ranks that did not carry them (flat: none)."""

    def _wire(self, kind: str) -> Optional[torch.dtype]:
        """The wire dtype of an all-reduce: ``sync.exchange_dtype`` for the periodic syncs and warm-up
        averages; fp32 (None) for the one-off final average and the buffers."""
        return self.wire_dtype if kind in ("sync", "warmup", "warmup_end") else None

    # -- sync.nonfinite: a diverged replica is detected, excluded and reset (gossip_accel/sync/health.py) --
    def _verdict(self, comps: list[Component]) -> Optional[health.Verdict]:
        """Gathers each of ``comps`` into its flat buffer (callers read ``comp.flat`` after it), then:
        who is sick among the ranks for each of them: ONE all-reduce of an (n, m) flag matrix
        (n * m * 4 bytes, counted in ``health_stats``). Raises per the policy; None with ``ignore``."""
        flats = [c.gather() for c in comps]
        if self.cfg.nonfinite == "ignore" or not comps:
            return None
        local = [any(health.replica_sick(flat, self.slots.get(c.name))) for c, flat in zip(comps, flats)]
        flags = health.flag_matrix(local, self.rank, self.world_size)
        with self.comm.accounting(self.health_stats):
            self.comm.allreduce_mean("nonfinite_flags", flags)
        verdict = health.Verdict.from_flags([c.name for c in comps], flags, scale=self.world_size)
        verdict.check(self.cfg.nonfinite, self.t)
        return verdict

    def _masked_allreduce(self, comp: Component, kind: str, verdict: Optional[health.Verdict], j: int) -> str:
        """comp.flat <- the mean over the healthy ranks (sick ones send zeros): Algorithm 1 line 8 on the
        full graph without the diverged replicas. Returns the rule to apply: a sick rank whose own BMUF
        slots are non-finite restarts them (``warmup_end``); otherwise the shared slots stay consistent."""
        sick = verdict is not None and verdict.sick[self.rank][j]
        if sick:
            comp.flat.zero_()
        self.comm.allreduce_mean(comp.name, comp.flat, self._wire(kind))
        if verdict is None or verdict.healthy(j) == self.world_size:
            return kind
        comp.flat.mul_(self.world_size / verdict.healthy(j))
        if not sick:
            return kind
        self._record_reset(comp, f"the average of the {verdict.healthy(j)} healthy ranks")
        slots = self.slots.get(comp.name)
        return "warmup_end" if health.slots_sick(slots) else kind

    def _neighbour_mean(self, comp: Component, kind: str, it: Exchange) -> str:
        """Algorithm 1 line 8 on the ring, non-finite copies dropped; a sick rank takes the mean of its
        finite neighbours and restarts its own slots from it (omega <- theta_bar, Delta <- 0: line 1)."""
        check = self.cfg.nonfinite != "ignore"
        own_ok, dropped = health.neighbour_mean_(comp.flat, it.recv_buffers, check)
        slots_bad = check and health.slots_sick(self.slots.get(comp.name))
        self.nonfinite_dropped += len(dropped)
        source = health.ring_decision(self.cfg.nonfinite, self.rank, self.t, comp.name, own_ok, slots_bad,
                                      dropped, it.recv_from)
        if source is None:
            return kind
        self._record_reset(comp, source)
        return "warmup_end"

    def _record_reset(self, comp: Component, source: str) -> None:
        params = health.component_params(comp) if comp is not self.buffers else ()
        event = health.ResetEvent(self.rank, self.t, comp.name, params, source)
        self.reset_events.append(event)
        health.warn_reset(event)
        if self.on_reset is not None and params:
            self.on_reset(list(params))

    def _all_components(self) -> list[Component]:
        return self.components + ([self.buffers] if self.buffers is not None else [])

    def _gossip_round(self, due: list) -> None:
        """Algorithm 1 lines 7-8 for all due components in one batched exchange."""
        items = []
        for comp, ev in due:
            plan = self.topology.plan(comp.index, ev.round)
            comp.gather()
            send = self._send[comp.name].copy_(comp.flat) if comp.name in self._send else comp.flat  # the wire
            items.append(Exchange(
                comp.name, comp.index, send, plan.send_to[self.rank],
                plan.recv_from[self.rank], self._recv[comp.name],
            ))
        self.comm.exchange(items)
        for (comp, ev), it in zip(due, items):
            self._apply(comp, self._neighbour_mean(comp, ev.kind, it))

    def _apply(self, comp: Component, kind: str) -> None:
        """comp.flat holds theta_bar: record divergence, apply the rule, write the parameters."""
        if self.cfg.track_divergence:
            self.divergence[comp.name] = self._relative_distance(comp)
        slots = self.slots.get(comp.name)
        bar = comp.flat
        staging = self._staging.get(comp.name)
        if staging is not None:
            bar = staging.copy_(comp.flat)
        new = new_local_model(kind, bar, slots, self.block_momentum, self.cfg.block_lr, self.cfg.nesterov)
        comp.scatter(new if new.device == comp.flat.device else comp.flat.copy_(new))

    @staticmethod
    def _relative_distance(comp: Component) -> float:
        """||theta_local - theta_bar|| / ||theta_bar|| of the component (worker divergence)."""
        sq, off = 0.0, 0
        for piece in comp.pieces:
            n = piece.view.numel()
            sq += float(torch.sum((piece.view.reshape(-1).float() - comp.flat[off:off + n]) ** 2))
            off += n
        return math.sqrt(sq) / (float(torch.linalg.vector_norm(comp.flat)) + 1e-12)

    def _sync_buffers(self, verdict: Optional[health.Verdict] = None) -> None:
        """Average (or broadcast) the float buffers; a rank with non-finite buffers is left out of the
        average (broadcast: the lowest healthy rank sends). ``verdict`` (buffers last) saves a flag all-reduce."""
        comp = self.buffers
        verdict = verdict if verdict is not None else self._verdict([comp])
        j = len(verdict.names) - 1 if verdict is not None else 0
        comp.gather()
        if self.cfg.buffers == "average":
            self._masked_allreduce(comp, "buffers", verdict, j)
        else:
            src = 0
            if verdict is not None and verdict.sick_ranks(j):
                src = min(k for k in range(self.world_size) if not verdict.sick[k][j])
                if verdict.sick[self.rank][j]:
                    self._record_reset(comp, f"the buffers of rank {src}")
            self.comm.broadcast(comp.name, comp.flat, src=src)
        comp.scatter()

    # -- metrics and state ---------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Scalars for TensorBoard: bytes, seconds and rounds per component and in total.

        ``sync/bytes_*`` count the periodic synchronization only; the initial broadcast and
        the final average are in ``sync/oneoff_bytes_*``.
        """
        out: dict[str, float] = {"sync/step": float(self.t)}
        if self.comm is None:
            return out
        for name, c in self.comm.stats.snapshot().items():
            out[f"sync/bytes_sent/{name}"] = c.bytes_sent
            out[f"sync/bytes_recv/{name}"] = c.bytes_recv
            out[f"sync/seconds/{name}"] = c.seconds
        total = self.comm.stats.total()
        out.update({
            "sync/bytes_sent": total.bytes_sent,
            "sync/bytes_recv": total.bytes_recv,
            "sync/seconds": total.seconds,
            "sync/calls": float(total.calls),
            "sync/oneoff_bytes_sent": self.oneoff_stats.total().bytes_sent,
            "sync/oneoff_bytes_recv": self.oneoff_stats.total().bytes_recv,
        })
        for name, d in self.divergence.items():
            out[f"sync/divergence/{name}"] = d
        if self.divergence:
            out["sync/divergence"] = sum(self.divergence.values()) / len(self.divergence)
        out["sync/nonfinite_resets"] = float(len(self.reset_events))
        out["sync/nonfinite_dropped"] = float(self.nonfinite_dropped)
        out["sync/nonfinite_flag_bytes_sent"] = self.health_stats.total().bytes_sent
        if self.engine is not None:
            out.update(self.engine.metrics())
        return out

    def bytes_per_step(self) -> float:
        """Mean bytes sent per optimizer step by this worker so far."""
        return self.comm.stats.total().bytes_sent / max(self.t, 1) if self.comm else 0.0

    def state_dict(self) -> dict:
        """Step counter, BMUF slots, sampler state and counters (this worker's; ranks differ)."""
        return {
            "version": STATE_VERSION,
            "t": self.t,
            "algorithm": self.cfg.algorithm,
            "seed": self.cfg.seed,
            "world_size": self.world_size,
            "rank": self.rank,
            "components": {c.name: c.numel for c in self.components},
            "slots": {k: {"omega": s.omega.detach().cpu().clone(), "delta": s.delta.detach().cpu().clone()}
                      for k, s in self.slots.items()},
            "comm": self.comm.stats.state_dict() if self.comm else {},
            "divergence": dict(self.divergence),
            "finalized": self.finalized,
            "engine": self.engine.state_dict() if self.engine is not None else {},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; a checkpoint of another setup is refused, naming the key.

        Load the model's weights first. For the asynchronous algorithms in RPC mode this is a
        collective (every rank calls it, as a resumed training run does): no worker may talk to
        the server or to a passive partner before they are restored.
        """
        for key, mine in (("algorithm", self.cfg.algorithm), ("seed", self.cfg.seed),
                          ("world_size", self.world_size), ("rank", self.rank),
                          ("components", {c.name: c.numel for c in self.components})):
            if state.get(key) != mine:
                raise ConfigError(
                    f"synchronizer checkpoint has {key}={state.get(key)!r} but this run has {mine!r}; "
                    "resume with the same sync config and number of processes"
                )
        if set(state["slots"]) != set(self.slots):
            raise ConfigError(
                f"synchronizer checkpoint holds slots for {sorted(state['slots'])}, this run needs {sorted(self.slots)}"
            )
        self.t = int(state["t"])
        for name, s in state["slots"].items():
            self.slots[name].omega.copy_(s["omega"])
            self.slots[name].delta.copy_(s["delta"])
        if self.comm is not None:
            self.comm.stats.load_state_dict(state.get("comm", {}))
        self.divergence = dict(state.get("divergence", {}))
        self.finalized = bool(state.get("finalized", False))
        if self.engine is not None:
            self.engine.load_state_dict(state.get("engine", {}))


class SyncedOptimizer:
    """An optimizer whose ``step()`` also runs ``synchronizer.step()``.

    For loops that prefer one object: ``opt = SyncedOptimizer(opt, sync)``. Everything else
    (``zero_grad``, ``param_groups``, ...) is the wrapped optimizer's.
    """

    def __init__(self, optimizer: Any, synchronizer: Synchronizer):
        self.optimizer = optimizer
        self.synchronizer = synchronizer

    def step(self, *args, **kwargs):
        out = self.optimizer.step(*args, **kwargs)
        self.synchronizer.step()
        return out

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "synchronizer": self.synchronizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.synchronizer.load_state_dict(state["synchronizer"])

    def __getattr__(self, name: str):
        return getattr(self.optimizer, name)
