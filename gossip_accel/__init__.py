"""gossip_accel: communication-efficient distributed training for speech and language models.

The heart is :class:`Synchronizer` (periodic per-component model synchronization: MA, BMUF,
local-/gossip-MA/BMUF per Algorithm 1 of 000_07fa007f7f1023ae.txt); for an Accelerate loop
use :class:`gossip_accel.sync.integrations.accelerate.AccelerateSynchronizer`. The synchronizer is the
subpackage :mod:`gossip_accel.sync`; the training toolkit (trainer, data, models, asr, bin) sits on it.

Names are imported lazily, so that light entry points (data preparation, validation) do not
pay for importing torch.
"""
from importlib import import_module

__version__ = "0.1.0"

def _sync():
    return import_module(".sync", __name__)  # not ``from . import sync``: that would call __getattr__


__all__ = sorted([*_sync().__all__, "shutdown"])


def __getattr__(name: str):
    """The synchronizer's public names (``from gossip_accel import Synchronizer``), lazily."""
    if name in _sync().__all__:
        return getattr(_sync(), name)
    raise AttributeError(f"module 'gossip_accel' has no attribute {name!r}")


def shutdown() -> None:
    """Tear down torch.distributed before exit: wait for any exchange still in flight, barrier,
    destroy_process_group, then wait until the gloo work threads have let go of the last
    collectives' tensors.

    An exchange still in flight is one posted by an overlapped sync (``sync.overlap_steps``) whose
    Synchronizer was closed after an error or dropped without ``finalize()``: it is waited for
    (:func:`gossip_accel.sync.comm.drain_in_flight`), its result discarded, with a warning.

    A gloo process that exits right after a collective can abort with SIGABRT ("terminate called
    without an active exception"): a work thread that drops a tensor while the interpreter is
    finalizing is ended by Python inside a ``noexcept`` destructor
    (:func:`gossip_accel.sync.comm.wait_for_idle_gloo_workers`). Every launched script calls this last.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        import warnings

        from .sync.comm import drain_in_flight, wait_for_idle_gloo_workers

        if names := drain_in_flight():
            warnings.warn("gossip_accel.shutdown: exchanges posted without waiting (sync.overlap_steps, ADPSGD) were "
                          f"still in flight for {', '.join(sorted(set(names)))}: their Synchronizer was closed or "
                          "dropped without finalize(), so no final average was taken; waited for them, discarded them",
                          RuntimeWarning, stacklevel=2)
        dist.barrier()
        dist.destroy_process_group()
        wait_for_idle_gloo_workers()
