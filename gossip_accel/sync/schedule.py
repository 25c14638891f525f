"""When a component synchronizes: the ``t mod H_i == 0`` test of Algorithm 1 (line 6), with warm-up.

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
"""
from __future__ import annotations

from dataclasses import dataclass

#: the values of ``sync.warmup_kind``
WARMUP_KINDS = ("average", "gradients", "ramp")


@dataclass(frozen=True)
class Event:
    """What happens to one component at one step."""

    kind: str  # "warmup" (full average), "warmup_end" (full average + slot reset), "restart" (slot reset), "sync"
    round: int  # 1-based sync round of the component (0 during warm-up)


def event_at(t: int, period: int, warmup_steps: int, warmup_period: int, warmup_kind: str = "average") -> Event | None:
    """The event of a component with period ``period`` at optimizer step ``t`` (1-based)."""
    if t <= warmup_steps:
        if t == warmup_steps:
            return Event("restart" if warmup_kind == "gradients" else "warmup_end", 0)
        if t % warmup_period == 0 and warmup_kind != "gradients":
            return Event("warmup", 0)
        return None
    local_t = t - warmup_steps
    if warmup_kind == "ramp":
        return _ramp_event(local_t, period, warmup_period)
    if local_t % period == 0:
        return Event("sync", local_t // period)
    return None


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
