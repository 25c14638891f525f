"""Joining the launcher's process group, and the Accelerator every trainer runs in."""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..sync.config import ConfigError
from ..sync.faults import set_timeout_setting


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: MASTER_PORT for a group launched on this machine (tests, benches)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_process_group(cpu: bool, collective_timeout: timedelta, join_timeout: float = 900.0) -> None:
    """Join the launcher's process group (env://) before Accelerate would, for two reasons:

    * joining may take long (workers of a restarted job import torch at different speeds), a
      collective may not: the group is created with ``join_timeout`` and then set to
      ``collective_timeout`` (``train.collective_timeout``) for everything after;
    * in a job the elastic agent restarted (TORCHELASTIC_RESTART_COUNT = k > 0) the group
      lives under the store prefix ``attempt<k>``: under static rendezvous (torchrun
      --master-port, accelerate launch) the agent keeps one TCPStore for all attempts, and
      the gloo addresses of the dead attempt would be found first ("Gloo connectFullMesh
      failed ... Connection refused").

    Accelerate skips its own ``init_process_group`` when a group exists. Launchers without
    MASTER_ADDR/RANK (e.g. mpirun) are left to Accelerate, and so are GPU jobs in their first
    attempt (the GPU path here, gloo + NCCL, is not tested on GPUs yet).
    """
    env = os.environ
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if (int(env.get("WORLD_SIZE", "1")) < 2 or "MASTER_ADDR" not in env or "RANK" not in env
            or not dist.is_available() or dist.is_initialized() or not (cpu or restart)):
        return
    join = timedelta(seconds=max(join_timeout, collective_timeout.total_seconds()))
    store, rank, world = next(dist.rendezvous("env://", timeout=join))
    if restart:
        store = dist.PrefixStore(f"gossip_accel/attempt{restart}", store)
    if not cpu:
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
    dist.init_process_group("gloo" if cpu else "cpu:gloo,cuda:nccl", store=store, rank=rank, world_size=world,
                            timeout=join)
    dist.set_timeout(collective_timeout)


def resolve_cpu(cpu: Optional[bool]) -> bool:
    """``train.cpu``: null means the CPU when no GPU is visible."""
    return cpu if cpu is not None else not torch.cuda.is_available()


def start_accelerator(cpu: Optional[bool], collective_timeout: float) -> Any:
    """The process group (:func:`init_process_group`) and an ``accelerate.Accelerator`` on it;
    its ``process_index`` / ``num_processes`` are this worker's rank and the world size."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    if not collective_timeout > 0:
        raise ConfigError(f"train.collective_timeout={collective_timeout}: seconds, > 0 (default 1800)")
    cpu = resolve_cpu(cpu)
    set_timeout_setting("train.collective_timeout")  # what a CollectiveTimeout of the trainers says to raise
    init_process_group(cpu, timedelta(seconds=collective_timeout))
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=collective_timeout))
    # where DDP wraps the model (the DDP baseline, sync.hierarchy; sync/integrations/accelerate.prepare),
    # its gradients are views of its buckets: no copy of every gradient into a bucket and back at each backward
    buckets = DistributedDataParallelKwargs(gradient_as_bucket_view=True)
    return Accelerator(cpu=cpu, kwargs_handlers=[timeout, buckets])
