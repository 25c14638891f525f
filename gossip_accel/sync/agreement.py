"""Ranks agree on what they run before the first collective that needs it.

Every rank describes what all ranks must share as a mapping ``key -> value`` (a fingerprint:
the resolved sync config, the derived p, q and eta, the world, every synchronized parameter
and buffer with shape and dtype, every component with period and size; on resume the loaded
step). :func:`agree` compares it with one small collective, an all-gather of a 32-byte
sha256 digest per rank. Only when the digests differ, a second gather carries the full
mappings, so that every rank raises the same one-line :class:`AgreementError` naming the
first key that differs and which ranks hold which value. Without it, ranks with different
periods wait for each other in different collectives until the process group's timeout
(30 min by default), and parameters of different shapes abort gloo (``EnforceNotMet``).

The gathers run under :func:`gossip_accel.sync.faults.guard` with ``sync.agreement_timeout``
(seconds, default 120): a rank that never arrives (it failed before building its
synchronizer, or runs other code) is a :class:`~gossip_accel.sync.faults.CollectiveTimeout`
naming the ranks waited for, not a hang.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import timedelta
from typing import Iterable, Mapping, Optional

import torch
import torch.distributed as dist

from .config import ConfigError, SyncConfig
from .faults import guard

#: the order in which differing keys are reported: the cause (config, model) before its effects
KEY_ORDER = ("sync.", "derived.", "world.", "param[", "buffer[", "component[", "state.")
MAX_LISTED = 4  # further differing keys named in the message


class AgreementError(ConfigError):
    """Ranks built the synchronizer from different configs, models or worlds (raised on every rank)."""


def config_items(cfg: SyncConfig, n: int) -> dict[str, str]:
    """``sync.<key>`` for every key of the resolved config (components by index), and the values
    derived from the n workers: ``derived.p``, ``derived.q``, ``derived.block_momentum``."""
    out: dict[str, str] = {}
    for key, value in dataclasses.asdict(cfg).items():
        if key == "components":
            for i, rule in enumerate(value):
                out[f"sync.components[{i}]"] = repr(rule)
            out["sync.components"] = f"{len(value)} rules"
        elif isinstance(value, dict):
            for sub, v in value.items():
                out[f"sync.{key}.{sub}"] = repr(v)
        else:
            out[f"sync.{key}"] = repr(value)
    if cfg.enabled:
        out["derived.p"] = repr(cfg.resolved_p(n))
        out["derived.q"] = repr(cfg.resolved_q(n))
        out["derived.block_momentum"] = repr(cfg.resolved_block_momentum(n))
        out["derived.engine"] = cfg.spec.engine
    return out


def tensor_items(kind: str, named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """``<kind>[<name>]`` -> shape and dtype of each named tensor (devices may differ per rank)."""
    return {f"{kind}[{name}]": f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" for name, t in named}


def digest(items: Mapping[str, str]) -> bytes:
    """sha256 of the sorted ``key=value`` lines (32 bytes)."""
    h = hashlib.sha256()
    for key in sorted(items):
        h.update(f"{key}={items[key]}\n".encode())
    return h.digest()


def _gather_bytes(payload: bytes, group: Optional[dist.ProcessGroup], timeout: float, what: str,
                  peers: list[int], size: Optional[int] = None) -> list[bytes]:
    """Every rank's ``payload`` (all-gather; fixed ``size`` bytes, or lengths first then padded)."""
    n = dist.get_world_size(group)

    def gather(t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(n)]
        fix = ("every rank must build the synchronizer at the same point of its program; raise "
               "sync.agreement_timeout if one is only slow to get there")
        with guard("agreement", what, peers, group, timeout=timeout, fix=fix):
            dist.all_gather(out, t, group=group, async_op=True).wait(timeout=timedelta(seconds=timeout))
        return out

    if size is None:
        lengths = gather(torch.tensor([len(payload)], dtype=torch.int64))
        size = int(max(int(x) for x in lengths))
        sizes = [int(x) for x in lengths]
    else:
        sizes = [size] * n
    buf = torch.zeros(max(size, 1), dtype=torch.uint8)
    buf[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else buf[:0]
    return [bytes(t[:s].tolist()) for t, s in zip(gather(buf), sizes)]


def _rank_list(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _order(key: str) -> tuple[int, str]:
    return next((i for i, p in enumerate(KEY_ORDER) if key.startswith(p)), len(KEY_ORDER)), key


def disagreement(views: list[Mapping[str, str]], ranks: list[int], what: str) -> Optional[str]:
    """The one-line message for differing ``views`` (one mapping per rank), None if they agree."""
    keys = sorted(set().union(*views), key=_order)
    differing = [k for k in keys if len({v.get(k) for v in views}) > 1]
    if not differing:
        return None
    first = differing[0]
    holders: dict[Optional[str], list[int]] = {}
    for rank, view in zip(ranks, views):
        holders.setdefault(view.get(first), []).append(rank)
    parts = [f"{_rank_list(rs)} {'have' if len(rs) > 1 else 'has'} {value if value is not None else 'no such entry'}"
             for value, rs in sorted(holders.items(), key=lambda kv: min(kv[1]))]
    more = differing[1:]
    tail = ""
    if more:
        listed = ", ".join(more[:MAX_LISTED]) + (", ..." if len(more) > MAX_LISTED else "")
        tail = f" ({len(more)} more differ: {listed})"
    return (f"ranks disagree on {first} ({what}): {'; '.join(parts)}{tail}; every rank must build the "
            "synchronizer with the same sync config, model and number of processes")


def agree(items: Mapping[str, str], group: Optional[dist.ProcessGroup] = None, timeout: float = 120.0,
          what: str = "sync config and model layout") -> None:
    """Raise :class:`AgreementError` on every rank of ``group`` unless all hold the same ``items``.

    One all-gather of 32 bytes when they agree; a mismatch costs two more (lengths, mappings).
    Not counted in the synchronizer's traffic counters.
    """
    n = dist.get_world_size(group)
    ranks = [r if group is None else dist.get_global_rank(group, r) for r in range(n)]
    digests = _gather_bytes(digest(items), group, timeout, what, ranks, size=32)
    if len(set(digests)) == 1:
        return
    payload = json.dumps(dict(items), sort_keys=True).encode()
    views = [json.loads(b.decode()) for b in _gather_bytes(payload, group, timeout, what, ranks)]
    message = disagreement(views, ranks, what)
    raise AgreementError(message or f"ranks disagree on the {what} (same entries, different digests)")
