"""The Synchronizer: periodic, per-component model synchronization (Algorithm 1).

Use it after every optimizer step::

    sync = Synchronizer(model, "conf/sync.yaml", overrides=["sync.period=8"])
    with sync:                       # exit = final average over all workers (line 20)
        for batch in loader:
            loss = model(batch); loss.backward(); opt.step(); opt.zero_grad()
            sync.step()              # lines 6-17 for every component that is due

Each worker trains its own replica (no gradient all-reduce); every H_i steps component i is
averaged over all workers (MA/BMUF) or over the node and q random ring neighbours
(gossip/local, Definition 1), then the update rule of ``sync.algorithm`` is applied. Every
family runs in its engine (:mod:`gossip_accel.sync.engines`: periodic, server for EASGD/ASGD,
pairwise for ADPSGD; the registry says which), behind one interface and with a narrow
:class:`~gossip_accel.sync.engines.base.EngineContext`; the asynchronous ones start a
torch.distributed.rpc session and end it in ``finalize`` (or ``close`` after an error). For
Accelerate's DDP-wrapped models use :class:`gossip_accel.sync.integrations.accelerate.AccelerateSynchronizer`,
which also switches off DDP's gradient all-reduce. Groups of ranks that all-reduce gradients
every step and synchronize between groups (``sync.hierarchy``) are the subclass
:class:`gossip_accel.sync.hierarchical.HierarchicalSynchronizer`; ``sync.exchange_dtype`` puts the
periodic syncs on a bf16/fp16 wire (:mod:`gossip_accel.sync.precision`).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from . import usage
from .agreement import agree, config_items, tensor_items
from .algorithms import Slots, start_slots
from .comm import CommStats, Communicator
from .components import Component, split_buffers, split_components
from .config import ConfigError, SyncConfig, load_sync_config, validate_for_world
from .elastic import MERGED_FROM, continues_as
from .engines import EngineContext, engine_class
from .inner_state import InnerState
from .precision import wire_dtype
from .schedule import event_at, quiet_until, stagger_offsets
from .topology import RingTopology, make_topology
from .warmup import GradientWarmup, restart_slots
from .wire import check_wire, wire_of

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
    """Owns components, BMUF slots, the step counter and the engine of one worker.

    Memory: BMUF keeps two fp32 slots (omega, Delta) of the model's size, on the parameters'
    device or on the CPU with ``sync.slots_on_cpu`` (``sync.outer_optimizer``: one fp32 copy p and the
    optimizer's state instead); gossip/local keep q receive buffers per
    component (in the periodic engine); every component has one flat work buffer. All are
    allocated at construction, once.
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
        self.released = True  # owns no model until built (usage.claim refuses a second live one)
        usage.claim(self.owned_module(), self)
        self.step_watch = usage.StepWatch()  # the optimizers given to watch()
        self.optimizers: list[torch.optim.Optimizer] = []  # the torch optimizers inside those (inner_state, warm-up)
        self.gradient_warmup: Optional[GradientWarmup] = None  # sync.warmup_kind=gradients (warmup.py)
        self.inner_state: Optional[InnerState] = None  # sync.inner_state=reset|average (inner_state.py)
        self._hooks: list = []  # the optimizer pre-hooks of the gradient warm-up
        self._initial_signature: Optional[tuple] = None
        self.components: list[Component] = split_components(
            self.model.named_parameters(), self.cfg.components, self.cfg.period
        )
        for comp, offset in zip(self.components, stagger_offsets([c.period for c in self.components], self.cfg.stagger)):
            comp.offset = offset  # sync.stagger (schedule.py)
        self.buffers: Optional[Component] = None
        if self.cfg.buffers != "local":
            self.buffers = split_buffers(
                self.model.named_buffers(), min(c.period for c in self.components)
            )
        self.finalized = False
        self._quiet = (0, 0)  # [a, b): steps on which no component and no buffer has an event (step() skips the test)
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
        self.wire_dtype = wire_dtype(self.cfg.exchange_dtype)  # sync.exchange_dtype (precision.py)
        # what the engine sees: never this object (engines/base.py)
        self.ctx = EngineContext(self.cfg, self.rank, self.world_size, None, process_group, None, self.components,
                                 self.buffers, carries=self._carries, share=self._share,
                                 before_buffers=self._before_buffers, wire_dtype=self.wire_dtype,
                                 block_momentum=self.block_momentum)
        self.slots: dict[str, Slots] = self.ctx.slots
        self.engine = None  # the registry's engine of sync.algorithm (engines/)
        self.process_group = process_group
        self.released = False
        self._agree()  # before any collective that needs the same config, model and world on every rank
        if not self.active:
            self.comm = None
            self.topology = None
            return

        validate_for_world(self.cfg, self.world_size)
        self.comm = self.ctx.comm = Communicator(process_group)
        # the initial broadcast and the final average are one-offs, kept out of the per-step counters
        self.oneoff_stats = CommStats()
        n = self.world_size
        self.topology = self.ctx.topology = make_topology(
            self.cfg.algorithm, n, self.cfg.resolved_p(n), self.cfg.resolved_q(n), self.cfg.seed, self.cfg.round_mixing
        )
        if self.cfg.broadcast_initial:  # Algorithm 1, line 1: theta_0^k <- theta_0
            self._broadcast_initial()
            self._initial_signature = self._weights_signature()
        if self.cfg.uses_bmuf:
            slot_device = torch.device("cpu") if self.cfg.slots_on_cpu else None
            for comp in self.ctx.carried():
                self.slots[comp.name] = start_slots(comp.gather(), self.cfg.outer_optimizer, slot_device)
        self.engine = engine_class(self.cfg.spec.engine)(self.ctx)
        if self.cfg.warmup_kind == "gradients" and self.cfg.warmup_steps > 0:
            self.gradient_warmup = GradientWarmup(self.comm, self.cfg.warmup_steps, lambda: self.t + 1)
        if self.cfg.inner_state != "keep":
            self.inner_state = InnerState(self.cfg.inner_state, self.ctx, self.optimizers)

    # -- the training-loop API -------------------------------------------------------------
    def step(self) -> None:
        """Call once per optimizer step: synchronizes the components (and buffers) that are due.

        Refused after :meth:`finalize`; with a :meth:`watch` ed optimizer, a call without one
        optimizer step since the previous call warns (:mod:`gossip_accel.sync.usage`).
        """
        usage.refuse_step_after_finalize(self)
        self.step_watch.check(self.t + 1)
        self.t += 1
        if not self.active:
            return
        self._refuse_without_optimizer()
        t = self.t
        due, buffers_due = ([], False) if self._quiet[0] <= t < self._quiet[1] else self._events(t)
        self.engine.step(t, due, buffers_due)
        if self.inner_state is not None:
            self.inner_state.after_sync(due)

    def _events(self, t: int) -> tuple[list, bool]:
        """(the due components and their events, are the buffers due?) at step t (line 6 of Algorithm 1 per
        component); a ``restart`` event restarts the slots here. A step without any event also records the
        steps after it on which none can come (``schedule.quiet_until``), which :meth:`step` then skips."""
        cfg = self.cfg
        due, events = [], 0
        for comp in self.components:
            ev = event_at(t, comp.period, cfg.warmup_steps, cfg.warmup_period, comp.offset, cfg.warmup_kind)
            events += ev is not None
            if ev is not None and ev.kind == "restart":  # the end of a gradient warm-up: nothing to exchange
                if self.ctx.carries(comp):
                    restart_slots(comp, self.slots.get(comp.name))
            elif ev is not None:
                due.append((comp, ev))
        buffers_event = self.buffers is not None and event_at(t, self.buffers.period, cfg.warmup_steps,
                                                              cfg.warmup_period, warmup_kind=cfg.warmup_kind) is not None
        if not events and not buffers_event:
            self._quiet = (t, min(quiet_until(t + 1, c.period, cfg.warmup_steps, cfg.warmup_period, c.offset,
                                              cfg.warmup_kind) for c in self._all_components()))
        return due, buffers_event and self.engine.syncs_buffers_in_step

    def _refuse_without_optimizer(self) -> None:
        """sync.warmup_kind=gradients (without a DDP hook) and sync.inner_state need the inner optimizer."""
        needs = ([f"sync.inner_state={self.cfg.inner_state}"] if self.inner_state is not None else []) + (
            ["sync.warmup_kind=gradients"] if self.gradient_warmup is not None and not self.gradient_warmup.via_ddp
            else [])
        if needs and not self.optimizers:
            raise usage.UsageError(f"{' and '.join(needs)} needs the inner optimizer: call sync.watch(optimizer) "
                                   "before training (SyncedOptimizer and AccelerateSynchronizer do)")

    def finalize(self) -> None:
        """theta = (1/n) sum_k theta_T^k (Algorithm 1, line 20): every replica ends equal.

        EASGD and ASGD end with the server's model (the centre variable, the global model)
        instead; ADPSGD first applies what is pending. Asynchronous runs close RPC here.
        """
        if self.active and not self.finalized:
            with self.comm.accounting(self.oneoff_stats):
                self.engine.finalize()
                if self.buffers is not None:
                    self.ctx.sync_buffers()
        self.finalized = True
        self._release()

    def close(self) -> None:
        """After an error: leave an RPC session without waiting for the other workers."""
        if self.engine is not None:
            self.engine.close()
        self._release()

    def watch(self, optimizer: Any) -> bool:
        """Check that :meth:`step` follows every step of ``optimizer`` exactly once (a torch step
        post-hook; :class:`gossip_accel.sync.usage.StepWatch`). ``SyncedOptimizer`` and
        ``AccelerateSynchronizer`` call it; False if the optimizer has no step hooks. The torch optimizer
        inside is also the one whose state ``sync.inner_state`` resets or averages, and whose step is
        preceded by the gradient all-reduce of a ``sync.warmup_kind=gradients`` warm-up."""
        inner = usage.inner_optimizer(optimizer)
        if inner is not None and all(inner is not o for o in self.optimizers):
            self.optimizers.append(inner)
            if self.gradient_warmup is not None:
                self._hooks.append(inner.register_step_pre_hook(self.gradient_warmup.optimizer_pre_hook))
        return self.step_watch.watch(optimizer)

    def owned_module(self) -> torch.nn.Module:
        """The module this synchronizer owns (one synchronizer per module: :func:`gossip_accel.sync.usage.claim`)."""
        return self.model

    def _release(self) -> None:
        self.released = True
        usage.release(self.owned_module(), self)
        self.step_watch.close()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

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

    # -- the state the engine shares through its context -------------------------------------
    @property
    def t(self) -> int:
        """Optimizer steps so far."""
        return self.ctx.t

    @t.setter
    def t(self, value: int) -> None:
        self.ctx.t = value

    @property
    def on_reset(self) -> Optional[Callable[[list[str]], None]]:
        """callable(list of parameter names) after a reset, e.g. clear their optimizer state."""
        return self.ctx.on_reset

    @on_reset.setter
    def on_reset(self, fn: Optional[Callable[[list[str]], None]]) -> None:
        self.ctx.on_reset = fn

    @property
    def divergence(self) -> dict[str, float]:
        return self.ctx.metrics.divergence

    @property
    def reset_events(self) -> list:
        """sync.nonfinite (health.py): the resets of this rank."""
        return self.ctx.metrics.reset_events

    @property
    def nonfinite_dropped(self) -> int:
        return self.ctx.metrics.nonfinite_dropped

    @property
    def health_stats(self) -> CommStats:
        return self.ctx.metrics.health_stats

    # -- the context pieces a subclass changes (gossip_accel/sync/hierarchical.py) ----------------
    def _carries(self, comp: Component) -> bool:
        """Does this rank run the algorithm for ``comp``? (Flat: every rank, every component.)"""
        return True

    def _carried(self) -> list[Component]:
        return self.ctx.carried()

    def _share(self, comps: list[Component]) -> None:
        """After a sync of ``comps``: hand the new values to the ranks that did not carry them (flat: none)."""

    def _before_buffers(self, buffers: Component) -> None:
        """Before the float buffers are synchronized between replicas (flat: nothing)."""

    def _broadcast_initial(self) -> None:
        """theta_0^k <- theta_0 of rank 0 (Algorithm 1, line 1), counted as a one-off."""
        with self.comm.accounting(self.oneoff_stats):
            broadcast_components(self.comm, self._all_components())

    def _all_components(self) -> list[Component]:
        return self.components + ([self.buffers] if self.buffers is not None else [])

    # -- agreement of the ranks (gossip_accel/sync/agreement.py) --------------------------------
    def _fingerprint(self) -> dict[str, str]:
        """What every rank must share: the resolved config, the world, the synchronized tensors."""
        items = config_items(self.cfg, self.world_size)
        items["world.size"] = repr(self.world_size)
        items.update(tensor_items("param", ((p.name, p.view) for c in self.components for p in c.pieces)))
        if self.buffers is not None:
            items.update(tensor_items("buffer", ((p.name, p.view) for p in self.buffers.pieces)))
        for c in self.components:
            items[f"component[{c.name}]"] = f"period {c.period}, {c.numel} elements"
        return items

    def _agreement_group(self) -> Optional[dist.ProcessGroup]:
        """The ranks that must agree (flat: the synchronizer's process group)."""
        return self.process_group

    def _agree(self, extra: Optional[dict[str, str]] = None) -> None:
        """:func:`gossip_accel.sync.agreement.agree` on :meth:`_fingerprint` (and ``extra``) when distributed."""
        group = self._agreement_group()
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) < 2:
            return
        agree({**self._fingerprint(), **(extra or {})}, group, self.cfg.agreement_timeout)

    def _weights_signature(self) -> tuple:
        """(sum, sum |x|) in float64 of every synchronized tensor: tells whether the weights changed."""
        out = []
        with torch.no_grad():
            for comp in self._all_components():
                for piece in comp.pieces:
                    v = piece.view.detach().double()
                    out.append((float(v.sum()), float(v.abs().sum())))
        return tuple(out)

    def _warn_if_restore_was_overwritten(self, t: int) -> None:
        """A checkpoint of step t > 0 whose weights are still those of the initial broadcast: they were
        loaded before the synchronizer was built (and rank 0's theta_0 overwrote them) or not at all."""
        if t > 0 and self._initial_signature is not None and self._weights_signature() == self._initial_signature:
            warnings.warn(
                f"gossip_accel: resuming at step {t}, but the model holds the weights of the initial broadcast (rank "
                "0's): load the checkpoint's weights after building the synchronizer, or build it with "
                "overrides=['sync.broadcast_initial=false'] when they are loaded before", usage.UsageWarning,
                stacklevel=3)

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
        engine = self.engine.state_dict() if self.engine is not None else {}  # first: it may complete exchanges
        return {
            "version": STATE_VERSION,
            "t": self.t,
            "algorithm": self.cfg.algorithm,
            "outer_optimizer": self.cfg.outer_optimizer,
            "seed": self.cfg.seed,
            "world_size": self.world_size,
            "rank": self.rank,
            "components": {c.name: c.numel for c in self.components},
            "slots": {k: s.state_dict() for k, s in self.slots.items()},
            "comm": self.comm.stats.state_dict() if self.comm else {},
            "divergence": dict(self.divergence),
            "finalized": self.finalized,
            "engine": engine,
            **({"wire": self._wire()} if self.engine is not None else {}),  # what the engine's state depends on
        }

    def _wire(self) -> dict:
        return wire_of(self.cfg, isinstance(self.topology, RingTopology))

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; a checkpoint of another setup is refused, naming the key.

        The order: build the synchronizer (its initial broadcast sets every replica to rank 0's
        theta_0), then load the model's weights, then call this (a checkpoint whose weights still
        equal the broadcast ones warns: they were loaded before the broadcast overwrote them; build
        with ``sync.broadcast_initial=false`` to load them first). A collective: every rank calls
        it, and the ranks agree on the config, the layout and the loaded step (``state.t``) first.
        For the asynchronous algorithms in RPC mode no worker may talk to the server or to a
        passive partner before they are restored. A state of another number of workers is refused,
        except the merge of all old ranks' states (:func:`gossip_accel.sync.elastic.merge_states`):
        elastic resume, on any number of ranks.
        """
        merged = bool(state.get(MERGED_FROM))  # n old ranks' states merged for this world (sync/elastic.py)
        same_slots = merged and continues_as(state.get("algorithm"), self.cfg.algorithm)
        for key, mine in (("algorithm", state.get("algorithm") if same_slots else self.cfg.algorithm),
                          ("outer_optimizer", self.cfg.outer_optimizer),
                          ("seed", self.cfg.seed),
                          ("world_size", None if merged else self.world_size), ("rank", None if merged else self.rank),
                          ("components", {c.name: c.numel for c in self.components})):
            if state.get(key) != mine:
                raise ConfigError(
                    f"synchronizer checkpoint has {key}={state.get(key)!r} but this run has {mine!r}; "
                    "resume with the same sync config and number of processes"
                    + ("" if key not in ("world_size", "rank") else
                       " (or merge the old ranks' states: gossip_accel.sync.elastic.merge_states)")
                )
        if self.engine is not None and not merged:  # (a merged state carries no engine state)
            check_wire(state.get("wire"), self._wire())
        if set(state["slots"]) != set(self.slots) and not (merged and set(self.slots) <= set(state["slots"])):
            raise ConfigError(
                f"synchronizer checkpoint holds slots for {sorted(state['slots'])}, this run needs {sorted(self.slots)}"
            )
        self._agree({"state.t": repr(int(state["t"])), "state.finalized": repr(bool(state.get("finalized")))})
        self._warn_if_restore_was_overwritten(int(state["t"]))
        self.t = int(state["t"])
        for name, slots in self.slots.items():
            slots.load_state_dict(state["slots"][name])
        if self.comm is not None:
            self.comm.stats.load_state_dict(state.get("comm", {}))
        self.divergence.clear()
        self.divergence.update(state.get("divergence", {}))
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
        synchronizer.watch(optimizer)  # a sync.step() of its own besides opt.step() warns

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
