"""``sync.warmup_kind=gradients``: DDP for the first ``sync.warmup_steps`` steps (docs/ALGORITHMS.md).

For optimizer steps t = 1..W the gradients are averaged over all workers before the optimizer
step, g_t <- (1/n) sum_k g_t^k, so every replica takes the same step from the same model (they were
made equal by the initial broadcast, Algorithm 1 line 1) and stays equal without any model average.
At step W the schedule's ``restart`` event restarts the BMUF slots from the replica itself
(omega <- theta_W, Delta <- 0: :func:`restart_slots`); then the configured algorithm runs.

Where the all-reduce happens:

* a DDP model (``AccelerateSynchronizer``): in DDP's communication hook (:func:`warmup_ddp_hook`),
  torch's own ``allreduce_hook`` during the warm-up and the no-op hook afterwards, so the warm-up is
  exactly DDP (the average is taken during backward, before gradient clipping);
* a plain model: in a step pre-hook of every watched optimizer (``Synchronizer.watch``,
  ``SyncedOptimizer``), one flat fp32 all-reduce of the gradients of the optimizer's parameters
  just before its step (after any clipping of the local gradients).

The bytes are counted as DDP's (ring all-reduce of the fp32 gradients, ``gradients`` in the
synchronizer's counters). The simulator averages its replicas' gradients with
:func:`mean_gradients_` between backward and the optimizer step.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .schedule import needs_gradient_allreduce

GRADIENTS = "gradients"  # the counter name of the gradient all-reduce (as the hierarchical one)


def allreduce_gradients(comm: Any, params: Sequence[torch.nn.Parameter]) -> None:
    """grad <- the mean over ``comm``'s group, one flat all-reduce; parameters without a gradient are
    skipped (every rank must skip the same)."""
    grads = [p.grad for p in params if p.requires_grad and p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.allreduce_mean(GRADIENTS, flat)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


@torch.no_grad()
def mean_gradients_(replicas: Sequence[Sequence[torch.nn.Parameter]]) -> None:
    """The simulator's all-reduce: every replica's .grad <- the mean over the replicas (summed in
    replica order, then divided); ``replicas[k]`` are replica k's parameters in one order."""
    for ps in zip(*replicas):
        ps = [p for p in ps if p.requires_grad and p.grad is not None]
        if not ps:
            continue
        mean = ps[0].grad.clone()
        for p in ps[1:]:
            mean.add_(p.grad)
        mean.div_(len(ps))
        for p in ps:
            p.grad.copy_(mean)


def restart_slots(comp, slots) -> None:
    """The ``restart`` event at the end of a gradient warm-up: the slots restart from this replica's
    own theta (omega <- theta_W, Delta <- 0; equal on every worker), the parameters stay."""
    if slots is not None:
        slots.restart(comp.gather())


class GradientWarmup:
    """The gradient all-reduce of one worker during the warm-up; ``next_step()`` is the 1-based number
    of the optimizer step about to be taken (the synchronizer's t + 1)."""

    def __init__(self, comm: Any, warmup_steps: int, next_step: Callable[[], int]):
        self.comm = comm
        self.warmup_steps = warmup_steps
        self.next_step = next_step
        self.via_ddp = False  # a DDP model averages in its comm hook; the optimizer hooks then do nothing

    def due(self) -> bool:
        return needs_gradient_allreduce(self.next_step(), self.warmup_steps, GRADIENTS)

    def optimizer_pre_hook(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        """torch step pre-hook: all-reduce the gradients of ``optimizer``'s parameters when due."""
        if self.via_ddp or not self.due():
            return
        allreduce_gradients(self.comm, [p for g in optimizer.param_groups for p in g["params"]])


def warmup_ddp_hook(state: GradientWarmup, bucket):  # no annotations: DDP checks them
    """DDP comm hook: torch's ``allreduce_hook`` (mean over the world, bytes counted as DDP's) during
    the warm-up, the no-op hook (local gradients) afterwards."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from .comm import ring_allreduce_bytes

    buf = bucket.buffer()
    if not state.due():
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut
    moved = ring_allreduce_bytes(buf.numel() * buf.element_size(), state.comm.world_size)
    state.comm.stats.add(GRADIENTS, moved, moved, 0.0)
    return allreduce_hook(state.comm.group, bucket)
