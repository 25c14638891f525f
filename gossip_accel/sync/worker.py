"""What ONE worker does with the values it received: the per-worker steps that the engines and the
simulator (the oracle) both call, so that the oracle checks the code that runs, not a copy of it.

* :func:`neighbour_mean`: Algorithm 1 line 8 on the ring (gossip/local), non-finite copies dropped,
  and what a sick rank does about it;
* :func:`pair_merge`: ADPSGD's pairwise average with one partner (002/004), or its delay-by-one form;
* :func:`server_reply`: an EASGD (eq. 9) / ASGD (eq. 2) worker applying the server's reply;
* :func:`easgd_sync_worker`: a worker's side of synchronous EASGD (eq. 8);
* :func:`record_reset`: the record, warning and optimizer-state hook of a reset replica;
* :func:`relative_distance`: the worker-divergence metric ||theta - ref|| / ||ref||.

Every function works on one worker's tensors; none communicates.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from . import health
from .algorithms import asgd_server_update, elastic_worker_update


def relative_distance(pieces: Sequence[torch.Tensor], ref: torch.Tensor) -> float:
    """||theta - ref|| / ||ref|| where theta is the concatenation of ``pieces`` (a component's live
    parameter views, or one flat tensor): the worker divergence of a component."""
    sq, off = 0.0, 0
    for piece in pieces:
        n = piece.numel()
        sq += float(torch.dist(piece.reshape(-1).float(), ref[off:off + n])) ** 2  # one kernel, no temporary of the difference squared
        off += n
    return math.sqrt(sq) / (float(torch.linalg.vector_norm(ref)) + 1e-12)


def record_reset(events: list, on_reset: Optional[Callable[[list[str]], None]], rank: int, step: int, comp,
                 source: str, is_buffers: bool = False) -> health.ResetEvent:
    """Worker ``rank``'s ``comp`` was non-finite at ``step`` and was reset to ``source``: append the
    :class:`~gossip_accel.sync.health.ResetEvent` to ``events``, warn, and call ``on_reset`` with the
    parameter names (the float buffers have none)."""
    params = () if is_buffers else health.component_params(comp)
    event = health.ResetEvent(rank, step, comp.name, params, source)
    events.append(event)
    health.warn_reset(event)
    if on_reset is not None and params:
        on_reset(list(params))
    return event


def neighbour_mean(policy: str, rank: int, step: int, name: str, bar: torch.Tensor,
                   received: Sequence[torch.Tensor], recv_from: Sequence[int], slots_bad: bool,
                   own: Optional[torch.Tensor] = None) -> tuple[int, Optional[str]]:
    """``bar`` (this worker's theta) <- its mean with the ``received`` copies (Algorithm 1 line 8 on the
    ring; :func:`health.neighbour_mean_` drops non-finite terms unless ``policy`` is ``ignore``).
    With ``own`` (an overlapped sync's snapshot theta_t) ``bar`` is only the buffer the mean of ``own`` and
    the copies lands in (no copy of ``own`` into it first).
    Returns (copies dropped, reset source): a source means the worker restarts its slots from ``bar``
    (rule ``warmup_end``); :func:`health.ring_decision` raises per the policy."""
    check = policy != "ignore"
    own_ok, dropped = (health.neighbour_mean_(bar, received, check) if own is None
                       else health.neighbour_mean_(own, received, check, out=bar))
    source = health.ring_decision(policy, rank, step, name, own_ok, check and slots_bad, dropped, recv_from)
    return len(dropped), source


def pair_merge(policy: str, rank: int, step: int, name: str, x: torch.Tensor, other: torch.Tensor, partner: str,
               sent: Optional[torch.Tensor] = None) -> tuple[bool, Optional[str]]:
    """x <- the pairwise average with the partner's copy ``other`` (delay-by-one: with ``sent``, the model
    this worker sent), in place; a non-finite partner copy is dropped, a non-finite own model is reset
    to it (:func:`health.pair_update_`). Returns (dropped, reset source or None)."""
    outcome = health.pair_update_(x, other, sent, check=policy != "ignore")
    return outcome == "dropped", health.single_source_decision(policy, rank, step, name, outcome, partner)


def server_reply(rule: str, policy: str, rank: int, step: int, name: str, x: torch.Tensor, reply: torch.Tensor,
                 alpha: float, pulled: Optional[torch.Tensor] = None) -> Optional[str]:
    """A worker applies the server's ``reply`` to its model ``x``, in place: ASGD (eq. 2) continues from
    the new global model (and remembers it in ``pulled``), EASGD (eq. 9, first line) takes the elastic
    step towards the old centre. A non-finite ``x`` restarts from the reply (returns the reset source)."""
    if policy != "ignore" and not health.all_finite(x):  # diverged: restart from the global model
        outcome = "reset" if health.all_finite(reply) else "lost"
        source = health.single_source_decision(policy, rank, step, name, outcome, "the server's global model")
        x.copy_(reply)
        if pulled is not None:
            pulled.copy_(reply)
        return source
    if rule == "asgd":
        x.copy_(reply)
        pulled.copy_(reply)
    else:
        elastic_worker_update(x, reply, alpha)
    return None


def easgd_sync_worker(x: torch.Tensor, centre: torch.Tensor, alpha: float, sick: bool) -> Optional[str]:
    """A worker's side of synchronous EASGD (eq. 8, first line without the gradient): the elastic step
    towards w~_t, in place; a sick worker (non-finite, excluded from the sum) restarts from w~_t."""
    if sick:
        x.copy_(centre)
        return "the server's centre variable"
    elastic_worker_update(x, centre, alpha)
    return None


def server_push(rule: str, centre: torch.Tensor, payload: torch.Tensor, alpha: float, server_lr: float,
                reject_nonfinite: bool) -> bool:
    """The server applies one worker's push to the centre ``centre``, in place: ASGD w~ <- w~ + server_lr
    * Delta (eq. 2), EASGD w~ <- w~ + alpha (w^i - w~) (eq. 9, second line). A non-finite push is
    rejected when ``reject_nonfinite`` (the centre stays finite); returns whether it was applied."""
    if reject_nonfinite and not health.all_finite(payload):
        return False
    if rule == "asgd":
        asgd_server_update(centre, payload, server_lr)
    else:
        elastic_worker_update(centre, payload, alpha)
    return True
