"""The int8/int4 exchange of the periodic engine (``sync.exchange_dtype: int8 | int4``, docs/ALGORITHMS.md).

What a worker keeps so that a quantized message has a reference the receiver shares
(:mod:`gossip_accel.sync.quantize` does the coding; the simulator keeps the same state per worker):

* full graph (MA, BMUF, every warm-up average): ``ref`` = the model every rank started the block from
  (equal on all ranks after a full average); the outer gradient delta_i = theta_i - ref travels as a quantized
  reduce-scatter + all-gather (``Communicator.allreduce_mean_coded``) with the worker's residual (n x chunk)
  and the chunk owner's residual (chunk); theta_bar = ref + mean. Memory: 2 N + N / n fp32 (ring algorithms:
  only with a warm-up, whose averages are full).
* ring, ``sync.quant_ring: copies``: per ring neighbour j, the copy of theta_i that j holds (``sent[j]``) and
  the copy of theta_j this rank holds (``copies[j]``), both updated by every message on the edge (CHOCO-SGD's
  public copies, kept per edge so a neighbour that is not chosen in a round misses nothing). Memory: 4 p N fp32.
* ring, ``sync.quant_ring: params``: the parameters themselves with error feedback (one residual, N fp32).

Overlapped (``sync.overlap_steps`` = tau, ring only): the messages are coded from the snapshot theta_t when the
sync is posted (``sent[j]`` / the residual change then) and applied to ``copies[j]`` at t + tau; the payloads in
flight are the exchange's (engines/overlap.py keeps the received ones until then and checkpoints them).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..comm import Exchange
from ..components import Component
from ..config import ConfigError
from ..quantize import Codec, coded_state, ring_receive, ring_send


class CodedExchange:
    """The references and residuals of one worker's carried components (module docstring)."""

    def __init__(self, codec: Codec, components: Sequence[Component], n: int, neighbours: Optional[Sequence[int]],
                 ring_scheme: str, full: bool = True):
        self.codec, self.n, self.ring_scheme = codec, n, ring_scheme
        self.state = {comp.name: coded_state(comp.gather(), n, neighbours, ring_scheme, full) for comp in components}
        self.follows: dict[str, bool] = {}  # a full average in which every rank was healthy: ref <- new model

    # -- the full graph --------------------------------------------------------------------------
    def full_mean(self, comm, comp: Component, sick: bool, healthy: int) -> None:
        """comp.flat (theta_i) <- theta_bar = ref + (n / healthy) mean_k D(Q(theta_k - ref + e_k))."""
        st = self.state[comp.name]
        delta = comp.flat.sub_(st["ref"])
        comm.allreduce_mean_coded(comp.name, delta, self.codec, st["residual"], st["owner"], sick)
        if healthy < self.n:
            delta.mul_(self.n / healthy)
        comp.flat.add_(st["ref"])
        self.follows[comp.name] = healthy == self.n
        if healthy < self.n:  # a reset rank's rule differs: the shared reference is theta_bar itself
            st["ref"].copy_(comp.flat)

    def after_rule(self, comp: Component, new: torch.Tensor) -> None:
        """The new local model of a full average is the next block's reference (the same on every rank)."""
        if self.follows.pop(comp.name, False):
            self.state[comp.name]["ref"].copy_(new)

    # -- the ring -------------------------------------------------------------------------------
    def ring_items(self, comp: Component, send_to: Sequence[int], recv_from: Sequence[int],
                   theta: Optional[torch.Tensor] = None) -> list[Exchange]:
        """The messages of this rank in a gossip round of ``comp``, coded now from ``theta`` (default comp.flat,
        theta_i; an overlapped sync passes its snapshot theta_t): one payload per receiver (copies) or one for
        all (params), and fresh receive buffers for the chosen neighbours' payloads (kept by the caller until
        :meth:`ring_received`)."""
        st, codec = self.state[comp.name], self.codec
        theta = comp.flat if theta is None else theta
        payloads = ring_send(codec, theta, st, send_to, self.ring_scheme)
        targets = [[dst] for dst in send_to] if self.ring_scheme == "copies" else [list(send_to)]
        items = [Exchange(comp.name, comp.index, p, to, [], []) for p, to in zip(payloads, targets)]
        if recv_from:
            bufs = [torch.empty(codec.payload_bytes(theta.numel()), dtype=torch.uint8, device=theta.device)
                    for _ in recv_from]
            items.append(Exchange(comp.name, comp.index, bufs[0], [], list(recv_from), bufs))
        return items

    def ring_received(self, comp: Component, recv_from: Sequence[int], payloads: Sequence[torch.Tensor]
                      ) -> list[torch.Tensor]:
        """The fp32 copies of the neighbours ``recv_from`` from their arrived ``payloads``: the copies scheme
        updates this rank's copy of each of them now (at t + tau when the exchange was overlapped)."""
        return ring_receive(self.codec, self.state[comp.name], recv_from, payloads, comp.flat.numel(), self.ring_scheme)

    def state_dict(self) -> dict:
        return {name: {k: v.clone() for k, v in st.items()} for name, st in self.state.items()}

    def load_state_dict(self, state: dict) -> None:
        mine = {(name, k): tuple(v.shape) for name, st in self.state.items() for k, v in st.items()}
        got = {(name, k): tuple(v.shape) for name, st in state.items() for k, v in st.items()}
        if got != mine:
            key = min(got.keys() ^ mine.keys() or {k for k in mine if got[k] != mine[k]})
            raise ConfigError(
                f"synchronizer checkpoint's int8/int4 wire state {key[0]}.{key[1]} is {got.get(key, 'missing')}, this "
                f"run's {mine.get(key, 'absent')} (another sync.quant_ring, sync.warmup_steps or model): resume "
                "with the same sync config, or start a new --exp-dir (or train.resume=false)")
        for name, st in state.items():
            for k, v in st.items():
                self.state[name][k].copy_(v)
