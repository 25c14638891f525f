"""Which update rule a schedule event applies (shared by the Synchronizer and the simulator)."""
from __future__ import annotations

from typing import Optional

import torch

from .bmuf import BMUFSlots, bmuf_update
from .ma import ma_update


def new_local_model(
    kind: str,
    theta_bar: torch.Tensor,
    slots: Optional[BMUFSlots],
    block_momentum: float,
    block_lr: float,
    nesterov: bool,
) -> torch.Tensor:
    """The component's new local model after its (neighbourhood) average ``theta_bar``.

    * ``sync`` with BMUF slots: the block-momentum filter (Algorithm 1, lines 10-13).
    * ``sync`` without slots (MA, gossip-MA, local-MA): the average itself (line 15).
    * ``warmup`` (full average during warm-up): the average; slots untouched.
    * ``warmup_end``: the average, and the slots restart from it (omega <- theta_bar, Delta <- 0).
    ``theta_bar`` may be overwritten.
    """
    if kind == "sync" and slots is not None:
        return bmuf_update(theta_bar, slots, block_momentum, block_lr, nesterov)
    if kind == "warmup_end" and slots is not None:
        slots.omega.copy_(theta_bar)
        slots.delta.zero_()
    return ma_update(theta_bar)
