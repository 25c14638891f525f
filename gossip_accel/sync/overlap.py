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
progress is garbage. Pure tensors: no communication. :func:`merge_into_` applies the merge straight to a
component's parameter views (no gather of the live model into a work buffer and no scatter back: two
passes fewer over the component, the same values); :func:`merge_component_` is what the engine and the
simulator call: that, or the gathered merge where it cannot.
"""
from __future__ import annotations

from typing import Sequence

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


def merge_into_(pieces: Sequence[torch.Tensor], snapshot: torch.Tensor, new: torch.Tensor, how: str, alpha: float,
                reset: bool = False) -> bool:
    """:func:`merge_` on the live parameters themselves: each of ``pieces`` (a component's views, theta_{t+tau},
    in the order of its flat buffer) <- the merge of its slice of ``snapshot`` and ``new`` (flat fp32), in place.
    The same operations on the same fp32 values as gathering, merging and scattering, so the same bits; only for
    contiguous fp32 pieces (a lower-precision parameter rounds after each operation in place): returns False,
    touching nothing, otherwise (the caller merges in the gathered buffer)."""
    if not all(p.dtype == torch.float32 and p.is_contiguous() and p.device == new.device for p in pieces):
        return False
    off = 0
    with torch.no_grad():
        for live in pieces:
            n = live.numel()
            merge_(live, snapshot[off:off + n].view_as(live), new[off:off + n].view_as(live), how, alpha, reset)
            off += n
    return True


def merge_component_(comp, snapshot: torch.Tensor, new: torch.Tensor, how: str, alpha: float,
                     reset: bool = False) -> None:
    """A component's live parameters <- the merge of theta_{t+tau} with ``snapshot`` and ``new``: in place
    (:func:`merge_into_`), or, for pieces it does not take, gathered into a fresh buffer, merged, scattered."""
    if not merge_into_([p.view for p in comp.pieces], snapshot, new, how, alpha, reset):
        comp.scatter(merge_(comp.gather().clone(), snapshot, new, how, alpha, reset))
