"""Accelerate integration: switch off DDP's gradient all-reduce and synchronize models instead.

Used like accelerate's ``LocalSGD``::

    accelerator = Accelerator(cpu=True)          # or on GPUs: Accelerator()
    model, opt, loader = accelerator.prepare(model, opt, loader)
    with AccelerateSynchronizer(accelerator, model, "conf/sync.yaml") as sync:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(batch); accelerator.backward(loss); opt.step(); opt.zero_grad()
            sync.step()                            # counts optimizer steps only
    # leaving the block averaged all replicas (Algorithm 1, line 20)

What it changes on the DDP wrapper: a no-op communication hook (gradients stay local; the
Future returns the bucket untouched), and ``broadcast_buffers = False`` unless the buffer
policy is ``broadcast`` (``forward_sync_buffers`` on torch >= 2.14) (DDP would otherwise overwrite every rank's BatchNorm statistics with
rank 0's at every forward).
"""

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..comm import Counter, ring_allreduce_bytes
from ..sync import Synchronizer


def noop_allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook that communicates nothing: each replica keeps its own gradients."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def counting_allreduce_hook(state: Counter, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce-mean hook, plus a byte count (ring model) in ``state``.

    Used to measure the DDP baseline with the same accounting as the synchronizer.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buf = bucket.buffer()
    moved = ring_allreduce_bytes(buf.numel() * buf.element_size(), dist.get_world_size())
    state.add(moved, moved, 0.0)
    return default_hooks.allreduce_hook(None, bucket)


class AccelerateSynchronizer(Synchronizer):
    """:class:`Synchronizer` for a model prepared by an ``accelerate.Accelerator``."""

    def __init__(
        self,
        accelerator: Any,
        model: torch.nn.Module,
        config: Any = None,
        overrides: Sequence[str] = (),
        process_group: Optional[dist.ProcessGroup] = None,
    ):
        self.accelerator = accelerator
        super().__init__(accelerator.unwrap_model(model), config, overrides, process_group)
        if isinstance(model, DistributedDataParallel) and self.cfg.enabled:
            model.register_comm_hook(state=None, hook=noop_allreduce_hook)
            if self.cfg.buffers != "broadcast":
                # torch >= 2.14 reads forward_sync_buffers; older releases broadcast_buffers
                for flag in ("forward_sync_buffers", "broadcast_buffers"):
                    if hasattr(model, flag):
                        setattr(model, flag, False)

    def step(self) -> None:
        """Count an optimizer step only when Accelerate really stepped (gradient accumulation)."""
        if getattr(self.accelerator, "sync_gradients", True):
            super().step()
