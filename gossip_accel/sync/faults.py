"""A collective that times out becomes a :class:`CollectiveTimeout` that says what hung.

A worker that hangs (SIGSTOP, a deadlock, a dead machine whose sockets stay open) leaves its
peers waiting in a collective. The process group's timeout (``train.collective_timeout``,
passed to ``init_process_group`` by :class:`gossip_accel.train.run.DistributedRun`) ends that
wait with gloo's terse "Timed out waiting 5000ms for recv operation"; :func:`guard` turns it
into an error naming the operation, the component, this rank, the peers, the timeout and the
setting to raise (the trainers' key, or the process group's timeout in a user's loop), so
the log of a restarted job says which rank to look at. The process then exits non-zero and
the launcher (``utils/launch.sh --max-restarts N``) restarts the job from its last checkpoint.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch
import torch.distributed as dist


#: where the collective timeout of a user's own loop is set (what a timeout error says to raise)
USER_TIMEOUT_SETTING = ("the process group's timeout (dist.init_process_group(..., timeout=timedelta(seconds=S)) or "
                        "Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=S))]))")
_timeout_setting = USER_TIMEOUT_SETTING


def set_timeout_setting(name: str) -> None:
    """Name the setting this process's collective timeout comes from, for the timeout errors:
    the bundled trainers set ``train.collective_timeout``; a user's loop keeps USER_TIMEOUT_SETTING."""
    global _timeout_setting
    _timeout_setting = name


class CollectiveTimeout(RuntimeError):
    """A collective of the synchronizer (or the trainer) did not complete within the timeout."""


class PeerLost(RuntimeError):
    """A peer closed its connection in the middle of a collective (it died)."""


def _is_timeout(e: BaseException) -> bool:
    text = str(e).lower()
    return "timed out" in text or "timeout" in text


def _is_peer_lost(e: BaseException) -> bool:
    text = str(e).lower()
    return "closed by peer" in text or "reset by peer" in text or "broken pipe" in text


def pg_timeout(group: Optional[dist.ProcessGroup] = None) -> Optional[float]:
    """The process group's collective timeout in seconds (None when unknown)."""
    try:
        pg = group or dist.distributed_c10d._get_default_group()
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:  # noqa: BLE001 - only for the message
        return None


def _ranks(peers: Sequence[int]) -> str:
    peers = sorted(set(peers))
    if len(peers) > 2 and peers == list(range(peers[0], peers[-1] + 1)):
        return f"ranks {peers[0]}-{peers[-1]}"
    return ("rank " if len(peers) == 1 else "ranks ") + ", ".join(map(str, peers))


@contextmanager
def guard(op: str, name: str, peers: Sequence[int], group: Optional[dist.ProcessGroup] = None,
          timeout: Optional[float] = None, fix: Optional[str] = None) -> Iterator[None]:
    """Run a collective; its timeout error becomes :class:`CollectiveTimeout`.

    ``op``: "all-reduce", "exchange", "broadcast", ...; ``name``: the component (or what the
    trainer was agreeing on); ``peers``: the global ranks this rank waited for; ``timeout``: the
    seconds waited when not the process group's (a ``Work.wait(timeout)``); ``fix``: what to do
    about a timeout, when not raising the process group's timeout (:func:`set_timeout_setting`).
    """
    try:
        yield
    except (CollectiveTimeout, PeerLost):
        raise
    except RuntimeError as e:
        rank = dist.get_rank() if dist.is_initialized() else 0
        others = [p for p in peers if p != rank]
        if _is_peer_lost(e):
            raise PeerLost(
                f"{op} of '{name}' failed on rank {rank}: a peer among {_ranks(others or peers)} closed its "
                f"connection (it died: look at its log for the cause, e.g. killed, out of memory); with "
                f"utils/launch.sh --max-restarts N the job restarts from its last checkpoint. ({e})") from e
        if not _is_timeout(e):
            raise
        t = pg_timeout(group) if timeout is None else timeout
        waited = f"{t:g} s" if t is not None else "the process group's timeout"
        fix = fix or f"raise {_timeout_setting} if the peers are only slow"
        raise CollectiveTimeout(
            f"{op} of '{name}' timed out on rank {rank} after {waited}, waiting for {_ranks(others or peers)}: "
            f"one of them hangs or died (look at its log; SIGSTOP, a deadlock, a dead machine); "
            f"{fix}; with utils/launch.sh --max-restarts N the job restarts from its last checkpoint. ({e})") from e
