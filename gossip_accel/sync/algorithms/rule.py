"""Which update rule a schedule event applies, and the slots a component keeps for it (shared by the
Synchronizer and the simulator)."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import torch

from .bmuf import BMUFSlots, bmuf_update
from .ma import ma_update
from .outer import OuterSlots, outer_update

#: the per-component slots of the BMUF family: the paper's (omega, Delta) or an outer optimizer's (p, state)
Slots = Union[BMUFSlots, OuterSlots]


def start_slots(theta: torch.Tensor, outer: Optional[Mapping[str, Any]] = None,
                device: torch.device | str | None = None) -> Slots:
    """A component's slots started from theta_0 (Algorithm 1, line 1): :class:`BMUFSlots` for the paper's
    rule, :class:`OuterSlots` when ``outer`` (``sync.outer_optimizer``) names a torch optimizer."""
    if outer is None:
        return BMUFSlots.start_from(theta, device)
    return OuterSlots.start_from(theta, outer, device)


def new_local_model(
    kind: str,
    theta_bar: torch.Tensor,
    slots: Optional[Slots],
    block_momentum: float,
    block_lr: float,
    nesterov: bool,
) -> torch.Tensor:
    """The component's new local model after its (neighbourhood) average ``theta_bar``.

    * ``sync`` with BMUF slots: the block-momentum filter (Algorithm 1, lines 10-13); with
      outer-optimizer slots: the outer optimizer's step on g = p - theta_bar (outer.py).
    * ``sync`` without slots (MA, gossip-MA, local-MA): the average itself (line 15).
    * ``warmup`` (full average during warm-up): the average; slots untouched.
    * ``warmup_end``: the average, and the slots restart from it (omega <- theta_bar, Delta <- 0;
      p <- theta_bar with a fresh optimizer state).
    ``theta_bar`` may be overwritten.
    """
    if kind == "sync" and isinstance(slots, OuterSlots):
        return outer_update(theta_bar, slots)
    if kind == "sync" and slots is not None:
        return bmuf_update(theta_bar, slots, block_momentum, block_lr, nesterov)
    if kind == "warmup_end" and slots is not None:
        slots.restart(theta_bar)
    return ma_update(theta_bar)
