"""gossip_accel: communication-efficient distributed training for speech and language models.

The heart is :class:`Synchronizer` (periodic per-component model synchronization: MA, BMUF,
local-/gossip-MA/BMUF per Algorithm 1 of 000_07fa007f7f1023ae.txt); for an Accelerate loop
use :class:`gossip_accel.integrations.accelerate.AccelerateSynchronizer`.
"""
from .config import ConfigError, ComponentRule, SyncConfig, load_sync_config
from .sync import SyncedOptimizer, Synchronizer
from .topology import FullTopology, RingTopology, TopologyError

__version__ = "0.1.0"

__all__ = [
    "ComponentRule", "ConfigError", "FullTopology", "RingTopology", "SyncConfig", "SyncedOptimizer",
    "Synchronizer", "TopologyError", "load_sync_config", "shutdown",
]


def shutdown() -> None:
    """Tear down torch.distributed before exit (barrier + destroy_process_group).

    A gloo process that exits right after a collective can abort with SIGABRT
    ("terminate called without an active exception"); every launched script calls this last.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
