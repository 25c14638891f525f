"""Timed training with stops every rank agrees on, ending on a whole traffic cycle.

The run trains in chunks sized from the warm-up (about ``CHECKS`` chunks in the budget;
whole cycles when a cycle is at most two such chunks).
After each chunk the ranks agree, with one all-reduce of a flag, whether the slowest has
used the budget; the clock is paused during that all-reduce (it is not counted, but it does
realign the workers a few times per run). At the first chunk end past the budget,
``at_budget`` runs on every rank at the same step (the worker snapshots the model there, so
that quality is compared at the same wall time for every setting); then the run continues
without further checks up to the next multiple of the cycle (the longest sync period: 128 for
(16,128); 1 for ddp and no-comm), so that the bytes per step of the timed window are exact.
With ``fixed_steps`` the run is exactly that many steps (the tests' tiny runs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

CHECKS = 4


@dataclass
class Timed:
    steps: int
    seconds: float  # this rank's time in training steps (stop checks and at_budget excluded)
    checks: int
    budget_steps: int  # where at_budget ran
    budget_seconds: float


def _max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def warm_up(step: Callable[[], None], steps: int) -> float:
    """Run ``steps`` untimed steps; the slowest rank's seconds per step (first step excluded if more)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    usable = times[1:] or times or [0.0]
    return _max_over_ranks(sum(usable) / len(usable))


def _timed(step: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - start


def train_for(step: Callable[[], None], cycle: int, budget_s: float, step_estimate_s: float,
              fixed_steps: Optional[int] = None, at_budget: Callable[[], None] = lambda: None) -> Timed:
    """Train past the budget to a whole cycle (or exactly ``fixed_steps``); see the module doc."""
    dist.barrier()
    if fixed_steps is not None:
        seconds = _timed(step, fixed_steps)
        at_budget()
        return Timed(fixed_steps, seconds, 0, fixed_steps, seconds)
    chunk = max(1, round(budget_s / CHECKS / max(step_estimate_s, 1e-6)))
    if cycle <= 2 * chunk:  # short cycles: check on cycle boundaries, no extra cycle after the budget
        chunk = cycle * max(1, round(chunk / cycle))
    steps, active, checks = 0, 0.0, 0
    while True:
        active += _timed(step, chunk)
        steps += chunk
        checks += 1
        if _max_over_ranks(float(active >= budget_s)) > 0:
            break
    budget_steps, budget_seconds = steps, active
    at_budget()
    rest = -steps % cycle
    active += _timed(step, rest)
    return Timed(steps + rest, active, checks, budget_steps, budget_seconds)
