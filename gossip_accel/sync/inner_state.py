"""``sync.inner_state``: what a synchronization does with the inner optimizer's state (docs/ALGORITHMS.md).

Every worker's inner optimizer (Adagrad's sum, Adam's exp_avg / exp_avg_sq, SGD's momentum buffer)
keeps per-parameter state that Algorithm 1 of 000 leaves alone when it replaces theta by the new
local model. At each sync of component i (a warm-up average or a sync of the algorithm):

* ``keep`` (the default, the paper's): the state stays as it is;
* ``reset``: the state tensors of the component's parameters return to their value before the
  first step (zeros; Adagrad's sum <- ``initial_accumulator_value``) and their step count to 0,
  as a fresh optimizer would hold them;
* ``average``: the state tensors are averaged exactly as the parameters are (fairseq BMUF's
  ``average_sync``): over all workers on the full graph (the all-reduce family, warm-up averages),
  with the same q neighbours of the same round on the ring (gossip/local), on the same wire dtype.
  The bytes are counted under ``<component>/inner_state``.

The state tensors of a component are those of the optimizer's state entries that have the shape
of the component's parameters (a row shard takes the same rows); scalar entries (``step``) and
state of another shape (e.g. a preconditioner matrix) are kept. Every rank must hold state for the
same parameters (it does after one optimizer step). The synchronizer learns the optimizer from
``watch`` (``SyncedOptimizer``, ``AccelerateSynchronizer``); the simulator is handed the replicas'.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .components import Component, Piece
from .health import neighbour_mean_
from .precision import is_low
from .schedule import Event
from .topology import RingTopology

#: the schedule events at which the parameters are averaged (and so the state is reset or averaged)
AVERAGING_EVENTS = ("warmup", "warmup_end", "sync")


@dataclass
class StateSlice:
    """One state tensor's part that belongs to one piece of a component."""

    view: torch.Tensor        # flat view into the optimizer's state tensor
    initial: float            # its value before the first step
    state: dict               # the parameter's state dict (its ``step`` is reset with ``reset``)


def _owner(view: torch.Tensor, optimizers: Sequence[torch.optim.Optimizer]):
    """(parameter, optimizer, param group) whose storage holds ``view`` (a piece: a parameter or its rows)."""
    ptr = view.untyped_storage().data_ptr()
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.untyped_storage().data_ptr() == ptr:
                    return p, opt, group
    return None, None, None


def state_slices(comp: Component, optimizers: Sequence[torch.optim.Optimizer]) -> list[StateSlice]:
    """The inner optimizer's state of ``comp``'s parameters (module docstring), in a rank-independent order."""
    out = []
    for piece in comp.pieces:
        p, opt, group = _owner(piece.view, optimizers)
        if p is None or p not in opt.state:
            continue
        state = opt.state[p]
        start = piece.view.storage_offset() - p.storage_offset()
        for key in sorted(k for k, v in state.items()
                          if torch.is_tensor(v) and v.shape == p.shape and v.is_floating_point() and v.dim() > 0):
            v = state[key]
            if not v.is_contiguous():
                raise ValueError(f"sync.inner_state: the optimizer state {key!r} of {piece.name} is not contiguous")
            initial = float(group.get("initial_accumulator_value", 0.0)) if key == "sum" else 0.0
            out.append(StateSlice(v.view(-1)[start:start + piece.view.numel()], initial, state))
    return out


def reset_(slices: Sequence[StateSlice]) -> None:
    """``reset``: every slice to its initial value, the step counts to 0."""
    with torch.no_grad():
        for s in slices:
            s.view.fill_(s.initial)
            step = s.state.get("step")
            if torch.is_tensor(step):
                step.zero_()
            elif step is not None:
                s.state["step"] = 0


def as_component(comp: Component, slices: Sequence[StateSlice], flat: Optional[torch.Tensor]) -> Component:
    """The state of ``comp`` as a component of its own (gather / scatter), named ``<comp>/inner_state``;
    ``flat`` is reused when it has the right size."""
    numel = sum(s.view.numel() for s in slices)
    if flat is None or flat.numel() != numel:
        flat = torch.zeros(numel, dtype=torch.float32, device=comp.flat.device)
    pieces = [Piece(f"{comp.name}/inner_state[{j}]", s.view) for j, s in enumerate(slices)]
    return Component(comp.index, f"{comp.name}/inner_state", comp.period, pieces, flat)


class InnerState:
    """``sync.inner_state`` on one worker: called by the Synchronizer after the engine synchronized
    the due components (``after_sync``). ``ctx`` is the engine context (comm, topology, rank, wire);
    ``optimizers`` the list of watched torch optimizers (it may grow after construction)."""

    def __init__(self, policy: str, ctx, optimizers: list):
        self.policy = policy
        self.ctx = ctx
        self.optimizers = optimizers
        self.flats: dict[str, torch.Tensor] = {}
        self.recv: dict[str, list[torch.Tensor]] = {}
        self.send: dict[str, torch.Tensor] = {}

    def _component(self, comp: Component) -> Component:
        state = as_component(comp, state_slices(comp, self.optimizers), self.flats.get(comp.name))
        self.flats[comp.name] = state.flat
        return state

    def after_sync(self, due: Sequence[tuple[Component, Event]]) -> None:
        """Reset or average the state of every due component whose parameters were just averaged."""
        due = [(c, e) for c, e in due if e.kind in AVERAGING_EVENTS and self.ctx.carries(c)]
        if self.policy == "reset":
            for comp, _ in due:
                reset_(state_slices(comp, self.optimizers))
            return
        ring = isinstance(self.ctx.topology, RingTopology)
        gossip = [(c, e) for c, e in due if ring and e.kind == "sync"]
        for comp, ev in [(c, e) for c, e in due if not (ring and e.kind == "sync")]:  # the full graph
            state = self._component(comp)
            self.ctx.comm.allreduce_mean(state.name, state.gather(), self.ctx.wire(ev.kind))
            state.scatter()
        if gossip:
            self._gossip_round(gossip)

    def _gossip_round(self, due: Sequence[tuple[Component, Event]]) -> None:
        """The states of the due components with the neighbours of the parameters' round (one batched exchange)."""
        from .comm import Exchange  # the distributed side only: the simulator imports this module without comm

        ctx, wire = self.ctx, self.ctx.wire("sync")
        states, items = [], []
        for comp, ev in due:
            plan = ctx.topology.plan(comp.index, ev.round)
            state = self._component(comp)
            flat = state.gather()
            if self.recv.get(comp.name) is None or self.recv[comp.name][0].numel() != flat.numel():
                self.recv[comp.name] = [torch.empty_like(flat, dtype=wire) for _ in range(ctx.topology.q)]
                if is_low(wire):
                    self.send[comp.name] = torch.empty_like(flat, dtype=wire)
            send = self.send[comp.name].copy_(flat) if is_low(wire) else flat
            recv_from = plan.recv_from[ctx.rank]
            items.append(Exchange(state.name, comp.index, send, plan.send_to[ctx.rank], recv_from,
                                  self.recv[comp.name][:len(recv_from)]))
            states.append(state)
        ctx.comm.exchange(items)
        for state, it in zip(states, items):
            neighbour_mean_(state.flat, it.recv_buffers, check=False)
            state.scatter()
