"""Elastic resume: the per-rank synchronizer states of n workers merged into the one state every
worker of a run with m != n workers loads (a node died and is gone, or nodes joined).

    states = [torch.load(f"ckpt/rank{r}.pt")["sync"] for r in range(n)]   # every old rank's
    sync.load_state_dict(merge_states(states))                             # on each of the m ranks

The rule (docs/RELIABILITY.md, "Elastic resume"):

* the model itself is not the synchronizer's: the caller loads the mean of the n replicas
  (theta = (1/n) sum_k theta^k, Algorithm 1 line 20 of 000; :func:`mean_tree` of the model states);
* the step counter t is carried (it is the same on every rank of a complete checkpoint; states
  of different steps are refused), so the schedule (periods, warm-up) continues where it was;
* the BMUF slots of each component (omega and Delta, or an outer optimizer's p and state) are the
  mean over the old ranks that hold them: under MA/BMUF they are identical on every rank and the
  mean is that value exactly (carried); under gossip/local BMUF every rank has its own and they are
  averaged like the replicas (:func:`slots_identical` tells which happened);
* the traffic counters are the mean over the old ranks (bytes per worker continue);
* the divergence gauge restarts; eta (eq. 6 of 001), p and q are re-derived for m by the new
  synchronizer, and the ring (Definition 1) is drawn for m nodes;
* the algorithm may change to one with the same slots (:func:`continues_as`: gossip_bmuf -> bmuf
  on 2 workers, where a ring needs 3);
* engines with per-world state are refused: EASGD/ASGD (the server's clocks of n workers, the
  centre variable) and ADPSGD (a pending pair exchange), and ``sync.hierarchy`` (groups of the old
  world); they resume on the same number of workers only.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from . import registry
from .config import ConfigError

#: the key of a merged state: the number of workers whose states it holds
MERGED_FROM = "merged_from"
HIERARCHY_KEY = "hierarchy"  # hierarchical.STATE_KEY (not imported: hierarchical imports the synchronizer)


def mean_tree(trees: Sequence[Any], keep_first: Sequence[str] = (), counters_from: int = 0) -> Any:
    """The element-wise mean of equally shaped nested dicts / lists / tuples of tensors and numbers.

    Floating tensors: the mean in float64, cast back; python floats: the mean; identical values
    come out as they went in, bit for bit; integer tensors, ints, bools, strings, None: the value of
    ``trees[counters_from]``, the first tree by default (counters such as a step count are the same on
    every rank). Dict keys in ``keep_first`` (at any depth) take that tree's value too: state whose
    average means nothing (e.g. an eigenbasis). Unchanged leaves are the input objects, not copies."""
    first, kept = trees[0], trees[counters_from]
    if isinstance(first, dict):
        if any(set(t) != set(first) for t in trees[1:]):
            raise ValueError(f"cannot average states with different keys: {sorted(first)[:6]} ...")
        return {k: kept[k] if k in keep_first else mean_tree([t[k] for t in trees], keep_first, counters_from)
                for k in first}
    if isinstance(first, (list, tuple)):
        if any(len(t) != len(first) for t in trees[1:]):
            raise ValueError(f"cannot average lists of different lengths ({[len(t) for t in trees]})")
        return type(first)(mean_tree(list(col), keep_first, counters_from) for col in zip(*trees))
    if torch.is_tensor(first) and first.is_floating_point():
        if all(torch.equal(first, t) for t in trees[1:]):
            return first
        return (sum(t.double() for t in trees) / len(trees)).to(first.dtype)
    if isinstance(first, float) and any(t != first for t in trees[1:]):
        return sum(trees) / len(trees)
    return kept


def slots_identical(states: Sequence[dict]) -> bool:
    """Were the BMUF slots the same on every old rank (global MA/BMUF), so that merging carries them?"""
    names = set().union(*(s["slots"] for s in states))
    for name in names:
        held = [s["slots"][name] for s in states if name in s["slots"]]
        flat = [torch.cat([v.reshape(-1).double() for v in _tensors(h)]) if _tensors(h) else torch.zeros(0)
                for h in held]
        if any(not torch.equal(flat[0], f) for f in flat[1:]):
            return False
    return True


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return [tree] if torch.is_tensor(tree) and tree.is_floating_point() else []


def continues_as(old: str, new: str) -> bool:
    """May a merged state of ``sync.algorithm=old`` load into a run of ``new``? Yes within the periodic
    family when both keep the same slots (or none): e.g. a gossip_bmuf checkpoint of 4 workers goes
    on as bmuf on 2, where a ring of 2 nodes is no ring (its omega and Delta mean the same)."""
    a, b = registry.get(old), registry.get(new)
    return a.family == b.family == "periodic" and a.bmuf_slots == b.bmuf_slots


def mean_counters(counters: Sequence[dict]) -> dict:
    """Per-name traffic counters (``{name: {bytes_sent, bytes_recv, seconds, calls}}``) averaged over
    the old ranks, a name missing on a rank counting as zero: the per-worker totals continue."""
    names = sorted(set().union(*counters))
    out = {}
    for name in names:
        fields = sorted(set().union(*(c[name] for c in counters if name in c)))
        out[name] = {f: type(next(c[name][f] for c in counters if name in c))(
            sum(c.get(name, {}).get(f, 0) for c in counters) / len(counters)) for f in fields}
    return out


def merge_states(states: Sequence[dict]) -> dict:
    """The synchronizer state of n old ranks (``Synchronizer.state_dict()`` of each, any order)
    merged by the rule of the module docstring; :meth:`Synchronizer.load_state_dict` accepts it
    on any number of ranks. A :class:`ConfigError` names what cannot be merged."""
    if not states:
        raise ConfigError("merge_states: no synchronizer states given")
    first = states[0]
    for key in ("algorithm", "outer_optimizer", "seed", "components", "t", "version"):
        values = [s.get(key) for s in states]
        if any(v != values[0] for v in values[1:]):
            raise ConfigError(f"the old ranks' synchronizer states differ in {key} ({values}): not one checkpoint")
    algorithm = first["algorithm"]
    family = registry.get(algorithm).family
    if family != "periodic":
        raise ConfigError(
            f"sync.algorithm={algorithm} ({family} family) keeps per-world state (the server's clocks and centre, "
            f"or a pending pair exchange) and resumes on {len(states)} workers only; elastic resume supports the "
            "periodic family (ma, bmuf, local_*, gossip_*); set train.elastic=false to be refused up front")
    if any(HIERARCHY_KEY in s for s in states):
        raise ConfigError(f"a sync.hierarchy checkpoint resumes on its {len(states)} workers only (its groups are "
                          "those of the old world); elastic resume supports flat synchronizers")
    names = sorted(set().union(*(s["slots"] for s in states)))
    slots = {name: mean_tree([s["slots"][name] for s in states if name in s["slots"]]) for name in names}
    return {
        "version": first["version"], "t": int(first["t"]), "algorithm": algorithm,
        "outer_optimizer": first["outer_optimizer"], "seed": first["seed"], "world_size": None, "rank": None,
        MERGED_FROM: len(states), "components": first["components"], "slots": slots,
        "comm": mean_counters([s.get("comm", {}) for s in states]),
        "divergence": {}, "finalized": False, "engine": {},
    }
