"""The engines: one per algorithm family of the registry, behind one interface (base.py).

* :mod:`.periodic`: MA, BMUF, local-/gossip-MA/BMUF (Algorithm 1 of 000);
* :mod:`.server`: EASGD, async EASGD, ASGD with a parameter server (001);
* :mod:`.pairwise`: ADPSGD (002/004);
* :mod:`.rpc`: the torch.distributed.rpc session the asynchronous ones share.
"""
from __future__ import annotations

from .base import Engine, EngineContext, SyncMetrics


def engine_class(name: str) -> type[Engine]:
    """The engine that ``Algorithm.engine == name`` names (imported on demand: RPC only when used)."""
    if name == "periodic":
        from .periodic import PeriodicEngine

        return PeriodicEngine
    if name == "server":
        from .server import ServerEngine

        return ServerEngine
    if name == "pairwise":
        from .pairwise import PairwiseEngine

        return PairwiseEngine
    raise KeyError(f"no engine {name!r}; the registry names periodic, server or pairwise")


__all__ = ["Engine", "EngineContext", "SyncMetrics", "engine_class"]
