"""Elastic averaging SGD (EASGD), eq. 7-9 of 001_3db6b3ddf1f13045.txt (Zhang, Choromanska, LeCun 2015).

The objective (eq. 7) couples every local model w^i to a centre variable w~ with the
quadratic penalty lambda ||w^i - w~||^2. Its gradient steps are, with alpha = eta * lambda,

    synchronous  (eq. 8):  w^i_{t+1} = w^i_t - eta grad(w^i_t) - alpha (w^i_t - w~_t)
                           w~_{t+1}  = w~_t + alpha sum_i (w^i_t - w~_t)
    asynchronous (eq. 9):  w^i <- w^i - alpha (w^i - w~)     worker i, when it talks to the server
                           w~  <- w~  + alpha (w^i - w~)      (both with the same w^i and w~)

The gradient term -eta grad(w^i) is the worker's own optimizer step (Algorithm 1, lines 3-5
of 000); every tau = H_i steps the elastic terms are applied after it, as in the
communication-period variant of Zhang et al. (their Algorithm 1 with period tau). The centre
variable is held by the parameter server (001, section 2: "the global model is stored on and
updated by a parameter server"); see docs/ALGORITHMS.md.

All functions work in place on flat float32 vectors (``elastic_exchange`` allocates d).
"""
from __future__ import annotations

import torch


def elastic_worker_update(theta: torch.Tensor, center: torch.Tensor, alpha: float) -> torch.Tensor:
    """w^i <- w^i - alpha (w^i - w~)  (first line of eq. 8 without the gradient, and of eq. 9).

    Written as (1 - alpha) w^i + alpha w~; ``theta`` is updated in place and returned.
    """
    return theta.mul_(1.0 - alpha).add_(center, alpha=alpha)


def elastic_center_update_sync(center: torch.Tensor, theta_sum: torch.Tensor, n: int, alpha: float) -> torch.Tensor:
    """w~ <- w~ + alpha sum_i (w^i - w~) = (1 - n alpha) w~ + alpha sum_i w^i  (second line of eq. 8).

    ``theta_sum`` is sum_i w^i_t over the n workers (the same t as ``center``); ``center`` is
    updated in place and returned. Stable for beta = n alpha < 2 (the centre moves to
    the mean for beta = 1).
    """
    return center.mul_(1.0 - n * alpha).add_(theta_sum, alpha=alpha)


def elastic_exchange(theta: torch.Tensor, center: torch.Tensor, alpha: float) -> None:
    """Eq. 9 for one worker against the server, both in place: the elastic difference
    d = w^i - w~ moves the worker by -alpha d and the centre by +alpha d (sum conserved)."""
    d = theta - center
    theta.sub_(d, alpha=alpha)
    center.add_(d, alpha=alpha)
