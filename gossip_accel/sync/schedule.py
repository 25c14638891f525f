"""When a component synchronizes: the ``t mod H_i == 0`` test of Algorithm 1 (line 6), with warm-up,
staggering and overlap.

Warm-up semantics (``sync.warmup_steps = W``, ``sync.warmup_period = P``): during steps
t = 1..W every component is averaged over *all* workers (plain MA, the full graph) at every
P-th step and at step W. At step W the BMUF slots restart from that average
(omega <- theta_bar, Delta <- 0), and from then on component i syncs with the configured
algorithm when (t - W + o_i) mod H_i == 0; its round number is (t - W + o_i) / H_i, which seeds the
neighbour draw. With W = 0 and o_i = 0 this is exactly Algorithm 1.

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


@dataclass(frozen=True)
class Event:
    """What happens to one component at one step."""

    kind: str  # "warmup" (full average), "warmup_end" (full average + slot reset), "sync"
    round: int  # 1-based sync round of the component (0 during warm-up)


def event_at(t: int, period: int, warmup_steps: int, warmup_period: int, offset: int = 0) -> Event | None:
    """The event of a component with period ``period`` and stagger ``offset`` at optimizer step ``t`` (1-based)."""
    if t <= warmup_steps:
        if t == warmup_steps:
            return Event("warmup_end", 0)
        if t % warmup_period == 0:
            return Event("warmup", 0)
        return None
    local_t = t - warmup_steps + offset
    if local_t % period == 0:
        return Event("sync", local_t // period)
    return None


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


def applied_at(t: int, period: int, warmup_steps: int, warmup_period: int, offset: int, overlap: int) -> bool:
    """Does step t change the component's parameters? A blocking event at t, or (``overlap`` = tau > 0)
    a ``sync`` posted at t - tau, whose result is applied at t."""
    ev = event_at(t, period, warmup_steps, warmup_period, offset)
    if ev is not None and (overlap == 0 or ev.kind != "sync"):
        return True
    if overlap == 0 or t - overlap < 1:
        return False
    old = event_at(t - overlap, period, warmup_steps, warmup_period, offset)
    return old is not None and old.kind == "sync"
