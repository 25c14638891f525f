"""The merge of an overlapped sync (``sync.overlap_steps = tau``), shared by the periodic engine and the
simulator (docs/ALGORITHMS.md, "Overlapped synchronization").

At a sync step t the worker snapshots its component, theta_t, and starts exchanging the snapshot;
it keeps training, and at step t + tau its model is theta_{t+tau}. The exchange's (neighbourhood)
average avg_t goes through the update rule of ``sync.algorithm`` (MA: the average itself; BMUF:
lines 10-13 of Algorithm 1 with G = avg_t - (omega + eta Delta), omega and Delta updated as in a
blocking sync), giving u = rule(avg_t), and is merged with the live model (``sync.overlap_merge``):

* ``delta`` (default): theta <- u + (theta_{t+tau} - theta_t): the new model plus the local progress of
  the tau steps. The next block's G then holds every local step exactly once (derivation in the docs).
* ``mix``: theta <- alpha theta_{t+tau} + (1 - alpha) u (Streaming DiLoCo, arXiv 2501.18512, with the
  mixing factor alpha = ``sync.overlap_mix``).
* ``replace``: theta <- u (the tau steps are dropped).

A worker whose snapshot was non-finite and is reset (``sync.nonfinite=reset``) takes u: its local
progress is garbage. Pure tensors: no communication.
"""
from __future__ import annotations

import torch


def merge_(live: torch.Tensor, snapshot: torch.Tensor, new: torch.Tensor, how: str, alpha: float,
           reset: bool = False) -> torch.Tensor:
    """``live`` (theta_{t+tau}, overwritten) <- the merged model of the module docstring; returns it."""
    if reset or how == "replace":
        return live.copy_(new)
    if how == "delta":
        return live.sub_(snapshot).add_(new)
    if how == "mix":
        return live.mul_(alpha).add_(new, alpha=1.0 - alpha)
    raise ValueError(f"sync.overlap_merge={how!r} is unknown")
