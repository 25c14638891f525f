"""Asynchronous decentralized parallel SGD (ADPSGD) on a ring, Cui et al. 2021 (002/004;
the model of Lian et al. 2018, "Asynchronous Decentralized Parallel SGD").

Workers form a ring; in every round each worker averages its model with one neighbour
(:class:`~gossip_accel.sync.topology.PairTopology`: the pairs of a round are a perfect matching,
so the mixing matrix W_r has 1/2 on each pair and is doubly stochastic). With X_r the
matrix of the n local models and g the local optimizer steps:

    fixed / randomized pattern:  X_{r+1} = (X_r - eta G(X_r)) W_r   the local step, then the average
    delay-by-one:                X_{r+1} = X_r W_r - eta G(X_r)      the average of round r is
                                                                     applied at round r + 1

In delay-by-one the exchange of round r starts right after the sync and runs while the next
local step computes; at the next sync the worker adds the correction (x_partner - x_sent)/2
to its current model, i.e. the average of the two sent models plus its own progress since.
Sums over the workers are conserved by every rule below (mass conservation: the global mean
follows the mean of the local steps).

All functions work in place on flat vectors.
"""
from __future__ import annotations

import torch


def pair_average(theta: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """theta <- (theta + other) / 2 (one row of W_r), in place."""
    return theta.add_(other).mul_(0.5)


def delayed_average(theta: torch.Tensor, sent: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
    """Delay-by-one: theta <- theta + (received - sent) / 2, in place.

    ``sent`` is this worker's model of the previous round as it went out, ``received`` the
    partner's model of that round: theta ends at (sent + received)/2 plus the local progress
    made since the exchange started.
    """
    return theta.add_(received, alpha=0.5).sub_(sent, alpha=0.5)


def passive_absorb(published: torch.Tensor, pending: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """The passive side of an asynchronous pairwise average, in place; returns the reply.

    The passive answers with its ``published`` model (as of its last sync, because its live
    parameters belong to its training thread), records the correction (incoming - published)/2
    in ``pending`` (added to its live model at its next sync) and updates ``published`` to the
    average, so that a second request in the same interval averages with the new value. The
    active sets itself to (incoming + reply)/2: the sum of the two models is conserved.
    """
    reply = published.clone()
    pending.add_(incoming, alpha=0.5).sub_(published, alpha=0.5)
    pair_average(published, incoming)
    return reply
