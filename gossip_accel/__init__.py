"""gossip_accel: communication-efficient distributed training for speech and language models.

The heart is :class:`Synchronizer` (periodic per-component model synchronization: MA, BMUF,
local-/gossip-MA/BMUF per Algorithm 1 of 000_07fa007f7f1023ae.txt); for an Accelerate loop
use :class:`gossip_accel.integrations.accelerate.AccelerateSynchronizer`.

Names are imported lazily, so that light entry points (data preparation, validation) do not
pay for importing torch.
"""
from importlib import import_module

__version__ = "0.1.0"

_LAZY = {
    "ComponentRule": "config", "ConfigError": "config", "SyncConfig": "config", "load_sync_config": "config",
    "SyncedOptimizer": "sync", "Synchronizer": "sync",
    "HierarchicalSynchronizer": "hierarchical", "make_synchronizer": "hierarchical",
    "FullTopology": "topology", "RingTopology": "topology", "TopologyError": "topology",
}

__all__ = sorted([*_LAZY, "shutdown"])


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'gossip_accel' has no attribute {name!r}")


def shutdown() -> None:
    """Tear down torch.distributed before exit (barrier + destroy_process_group).

    A gloo process that exits right after a collective can abort with SIGABRT
    ("terminate called without an active exception"); every launched script calls this last.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
