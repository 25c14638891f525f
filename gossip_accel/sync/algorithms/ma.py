"""Model averaging (MA / BSP), and its gossip and local variants."""
from __future__ import annotations

import torch


def ma_update(theta_bar: torch.Tensor) -> torch.Tensor:
    """New local model = the average (Algorithm 1, line 15; eq. 1 of 001_3db6b3ddf1f13045.txt).

    ``theta_bar`` is the mean over all workers (MA) or over the node and its q chosen
    neighbours (gossip-MA, local-MA: Algorithm 1, line 8).
    """
    return theta_bar
