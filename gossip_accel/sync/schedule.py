"""When a component synchronizes: the ``t mod H_i == 0`` test of Algorithm 1 (line 6), with warm-up.

Warm-up semantics (``sync.warmup_steps = W``, ``sync.warmup_period = P``): during steps
t = 1..W every component is averaged over *all* workers (plain MA, the full graph) at every
P-th step and at step W. At step W the BMUF slots restart from that average
(omega <- theta_bar, Delta <- 0), and from then on component i syncs with the configured
algorithm when (t - W) mod H_i == 0; its round number is (t - W) / H_i, which seeds the
neighbour draw. With W = 0 this is exactly Algorithm 1.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """What happens to one component at one step."""

    kind: str  # "warmup" (full average), "warmup_end" (full average + slot reset), "sync"
    round: int  # 1-based sync round of the component (0 during warm-up)


def event_at(t: int, period: int, warmup_steps: int, warmup_period: int) -> Event | None:
    """The event of a component with period ``period`` at optimizer step ``t`` (1-based)."""
    if t <= warmup_steps:
        if t == warmup_steps:
            return Event("warmup_end", 0)
        if t % warmup_period == 0:
            return Event("warmup", 0)
        return None
    local_t = t - warmup_steps
    if local_t % period == 0:
        return Event("sync", local_t // period)
    return None
