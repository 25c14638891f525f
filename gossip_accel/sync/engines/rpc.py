"""torch.distributed.rpc plumbing of the asynchronous engines (server.py, pairwise.py): one RPC session
per synchronizer, the services it registers, the worker names.

A service (the parameter server, a passive ADPSGD worker) is registered under a key that every
rank of the session shares before RPC starts, so a request can never arrive before its handler
exists; the module-level functions the engines send by RPC look their service up here.
"""
from __future__ import annotations

import os
import socket
import uuid
import warnings
from typing import Any, Optional

import torch.distributed as dist
import torch.distributed.rpc as rpc

from ..config import ConfigError

#: services of this process, by the key its RPC session shares with the other ranks
SERVICES: dict[str, Any] = {}


def rpc_name(rank: int) -> str:
    return f"gossip_accel{rank}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RpcSession:
    """torch.distributed.rpc for the lifetime of one synchronizer.

    Rendezvous: ``sync.rpc_init_method`` if given, else rank 0 picks a free TCP port on
    ``$MASTER_ADDR`` (127.0.0.1 when unset) and broadcasts it with the process group. The
    local ``service`` is registered under a key all ranks share before RPC starts, so a
    request can never arrive before its handler exists.
    """

    def __init__(self, group: Optional[dist.ProcessGroup], rank: int, world: int, timeout: float,
                 init_method: Optional[str], service: Any):
        try:
            rpc.get_worker_info()
            already = True
        except RuntimeError:
            already = False
        if already:
            raise ConfigError("torch.distributed.rpc is already initialized in this process; the asynchronous "
                              "algorithms start their own RPC session (or use sync.lockstep=true)")
        obj: list = [init_method, None]
        if rank == 0:
            if init_method is None:
                obj[0] = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{_free_port()}"
            obj[1] = uuid.uuid4().hex
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(obj, src=src, group=group)
        self.init_method, self.key = obj
        self.rank = rank
        SERVICES[self.key] = service
        opts = rpc.TensorPipeRpcBackendOptions(init_method=self.init_method, rpc_timeout=timeout,
                                               num_worker_threads=max(16, 2 * world + 4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own ProcessGroup deprecation notices from init_rpc
            rpc.init_rpc(rpc_name(rank), rank=rank, world_size=world, rpc_backend_options=opts)
        self.open = True

    def shutdown(self, graceful: bool = True) -> None:
        """``graceful``: wait until every rank is here and no RPC is outstanding anywhere."""
        if self.open:
            self.open = False
            try:
                rpc.shutdown(graceful=graceful)
            finally:
                SERVICES.pop(self.key, None)


def service(key: str) -> Any:
    """The service this process registered under ``key`` (called on the RPC threads)."""
    return SERVICES[key]
