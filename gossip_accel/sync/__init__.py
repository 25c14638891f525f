"""The synchronizer: periodic and asynchronous model synchronization for data-parallel training.

A small library that knows nothing of speech or text (tests/test_architecture.py keeps it so):
the toolkit (``gossip_accel.train``, ``data``, ``models``, ``asr``, ``bin``) is built on its
public API. Its rooms are described in docs/ARCHITECTURE.md.

Names are imported lazily, so that importing the config (``gossip_accel.sync.config``) does not
pay for torch.distributed.
"""
from importlib import import_module

_LAZY = {
    "ComponentRule": "config", "ConfigError": "config", "SyncConfig": "config", "load_sync_config": "config",
    "SyncedOptimizer": "synchronizer", "Synchronizer": "synchronizer",
    "HierarchicalSynchronizer": "hierarchical", "make_synchronizer": "hierarchical",
    "FullTopology": "topology", "RingTopology": "topology", "TopologyError": "topology",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'gossip_accel.sync' has no attribute {name!r}")
