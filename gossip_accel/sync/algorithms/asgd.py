"""Asynchronous SGD with a parameter server (ASGD), eq. 2 of 001_3db6b3ddf1f13045.txt.

Each worker pulls the current global model w~, computes its update on a mini-batch and
pushes it; the server applies every push as it arrives:

    w~_{t+k+1} = w~_{t+k} - eta grad(w^i_t)                               (eq. 2)

where grad(w^i_t) was computed on the model pulled at time t and k other pushes arrived in
between: k is the *staleness* of the update. Here the worker's own optimizer takes tau = H_i
local steps (tau = 1 is eq. 2 literally with plain SGD); the pushed update is the sum of those
steps, Delta^i = w^i - w~_pulled (= -eta sum grad for SGD; any torch optimizer works), and
the server applies w~ <- w~ + server_lr * Delta^i. The worker then continues from the model
it pulls back. Table 4 of 001 varies tau (5, 20, 80).

Bounded staleness (stale synchronous parallel): with ``sync.max_staleness = S`` no worker is
allowed to be more than S pushes ahead of the slowest worker still training; a worker that
is further ahead waits for its pull. Then any push has k <= (n - 1)(2S + 2)
(:func:`staleness_bound`). S = None never waits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


def asgd_delta(theta: torch.Tensor, pulled: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The update a worker pushes: Delta^i = w^i - w~_pulled (its tau local steps since the pull)."""
    return torch.sub(theta, pulled, out=out) if out is not None else theta - pulled


def asgd_server_update(center: torch.Tensor, delta: torch.Tensor, server_lr: float = 1.0) -> torch.Tensor:
    """w~ <- w~ + server_lr * Delta^i (eq. 2 with Delta^i = -eta grad), in place."""
    return center.add_(delta, alpha=server_lr)


def ssp_may_proceed(clock: int, clocks_in_training: list[int], max_staleness: Optional[int]) -> bool:
    """Stale synchronous parallel: may a worker at ``clock`` (pushes so far) pull now?

    It may when it is at most ``max_staleness`` pushes ahead of the slowest worker that is
    still training; the slowest worker itself always may, so the rule cannot deadlock.
    """
    if max_staleness is None or not clocks_in_training:
        return True
    return clock - min(clocks_in_training) <= max_staleness


def staleness_bound(n: int, max_staleness: Optional[int]) -> Optional[int]:
    """Largest possible k of eq. 2 under SSP with bound S: (n - 1)(2S + 2).

    Between a worker's pull (its clock c, when every other clock was >= c - 1 - S) and its next
    push (when every clock is <= c + S + 1), another worker pushes at most 2S + 2 times.
    """
    return None if max_staleness is None else (n - 1) * (2 * max_staleness + 2)


@dataclass
class StalenessStats:
    """Staleness k of eq. 2 (server updates between a worker's pull and its push), and the SSP
    clock gap (how far ahead of the slowest worker a pull was released)."""

    count: int = 0
    total: int = 0
    max: int = 0
    max_clock_gap: int = 0
    waits: int = 0  # pulls held back by the SSP bound
    histogram: dict[int, int] = field(default_factory=dict)

    def add(self, k: int) -> None:
        self.count += 1
        self.total += k
        self.max = max(self.max, k)
        self.histogram[k] = self.histogram.get(k, 0) + 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def state_dict(self) -> dict:
        return {"count": self.count, "total": self.total, "max": self.max, "max_clock_gap": self.max_clock_gap,
                "waits": self.waits, "histogram": dict(self.histogram)}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, dict(v) if k == "histogram" else v)
