"""When a component synchronizes: the ``t mod H_i == 0`` test of Algorithm 1 (line 6), with warm-up,
staggering and overlap.

Warm-up semantics (``sync.warmup_steps = W``, ``sync.warmup_period = P``, ``sync.warmup_kind``):

* ``average`` (the default): during steps t = 1..W every component is averaged over *all* workers
  (plain MA, the full graph) at every P-th step and at step W. At step W the BMUF slots restart
  from that average (omega <- theta_bar, Delta <- 0), and from then on component i syncs with the
  configured algorithm when (t - W) mod H_i == 0; its round number is (t - W) / H_i, which seeds
  the neighbour draw. With W = 0 this is exactly Algorithm 1.
* ``gradients`` (DDP for W steps): the gradients of steps 1..W are all-reduced before the optimizer
  step (:mod:`gossip_accel.sync.warmup`), so the replicas stay identical and no model is averaged;
  at step W the event ``restart`` restarts the BMUF slots from the replica itself (omega <- theta_W,
  Delta <- 0), without communication. After W: as ``average``.
* ``ramp``: the ``average`` warm-up, then the period of component i grows from P: its k-th sync
  after W comes h_k = min(H_i, P 2^(k-1)) steps after the previous one (k = 1, 2, ...; P, 2P, 4P, ...
  until H_i, then H_i), i.e. at local_t = t - W = P (2^k - 1) while P 2^(k-1) < H_i, then every H_i;
  round number k. With P >= H_i it is ``average``.

With staggering (below) the test reads (t - W + o_i) mod H_i == 0 (and local_t = t - W + o_i in
the ramp).

Staggering (``sync.stagger``, docs/ALGORITHMS.md): the K components that share a period H (in
component order, k = 0..K-1) get the offsets o_k = floor(k H / K), so they sync at K different steps
of each period instead of all at once; without it every o_i = 0. The offsets depend only on the
config and the model's split, so every rank (and the simulator) computes the same ones, and the
round numbers, hence the gossip draws, stay identical across ranks.

Overlap (``sync.overlap_steps = tau``): a ``sync`` event of step t is posted at t and applied at
t + tau (:func:`applied_at`); warm-up averages stay blocking.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

#: the values of ``sync.warmup_kind``
WARMUP_KINDS = ("average", "gradients", "ramp")


@dataclass(frozen=True)
class Event:
    """What happens to one component at one step."""

    kind: str  # "warmup" (full average), "warmup_end" (full average + slot reset), "restart" (slot reset), "sync"
    round: int  # 1-based sync round of the component (0 during warm-up)


def event_at(t: int, period: int, warmup_steps: int, warmup_period: int, offset: int = 0,
             warmup_kind: str = "average") -> Event | None:
    """The event of a component with period ``period`` and stagger ``offset`` at optimizer step ``t`` (1-based)."""
    if t <= warmup_steps:
        if t == warmup_steps:
            return Event("restart" if warmup_kind == "gradients" else "warmup_end", 0)
        if t % warmup_period == 0 and warmup_kind != "gradients":
            return Event("warmup", 0)
        return None
    local_t = t - warmup_steps + offset
    if warmup_kind == "ramp":
        return _ramp_event(local_t, period, warmup_period)
    if local_t % period == 0:
        return Event("sync", local_t // period)
    return None


def quiet_until(t: int, period: int, warmup_steps: int, warmup_period: int, offset: int = 0,
                warmup_kind: str = "average") -> int:
    """A step t' >= t such that :func:`event_at` is None on every step of [t, t'): after the warm-up, the next
    step with (t' - W + o_i) mod H_i == 0; during the warm-up and in the ``ramp`` schedule t itself (no promise).
    Lets a caller skip the per-component test on the steps where nothing can be due."""
    if t <= warmup_steps or warmup_kind == "ramp":
        return t
    return t + (-(t - warmup_steps + offset)) % period


def stagger_offsets(periods: Sequence[int], stagger: bool) -> list[int]:
    """o_i of every component (in component order): o_k = floor(k H / K) for the k-th of the K components
    of period H with ``stagger`` (``sync.stagger``), else 0."""
    if not stagger:
        return [0] * len(periods)
    members: dict[int, list[int]] = {}
    for i, h in enumerate(periods):
        members.setdefault(h, []).append(i)
    out = [0] * len(periods)
    for h, idx in members.items():
        for k, i in enumerate(idx):
            out[i] = (k * h) // len(idx)
    return out


def applied_at(t: int, period: int, warmup_steps: int, warmup_period: int, offset: int, overlap: int,
               warmup_kind: str = "average") -> bool:
    """Does step t change the component's parameters? A blocking event at t, or (``overlap`` = tau > 0)
    a ``sync`` posted at t - tau, whose result is applied at t."""
    ev = event_at(t, period, warmup_steps, warmup_period, offset, warmup_kind)
    if ev is not None and (overlap == 0 or ev.kind != "sync"):
        return True
    if overlap == 0 or t - overlap < 1:
        return False
    old = event_at(t - overlap, period, warmup_steps, warmup_period, offset, warmup_kind)
    return old is not None and old.kind == "sync"


def _ramp_event(local_t: int, period: int, first: int) -> Event | None:
    """Intervals first, 2 first, 4 first, ... while below ``period``, then ``period`` (module docstring)."""
    doublings = 0  # J: the intervals first * 2^(k-1) < period
    while first << doublings < period:
        doublings += 1
    ramp_end = first * ((1 << doublings) - 1)  # S = P (2^J - 1): where the ramp ends
    if local_t <= ramp_end:
        k = (local_t // first + 1).bit_length() - 1  # local_t = P (2^k - 1)?
        return Event("sync", k) if local_t % first == 0 and first * ((1 << k) - 1) == local_t else None
    if (local_t - ramp_end) % period == 0:
        return Event("sync", doublings + (local_t - ramp_end) // period)
    return None


def needs_gradient_allreduce(next_step: int, warmup_steps: int, warmup_kind: str) -> bool:
    """Are the gradients of optimizer step ``next_step`` (1-based) all-reduced (``gradients`` warm-up)?"""
    return warmup_kind == "gradients" and next_step <= warmup_steps
