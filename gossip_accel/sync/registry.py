"""Every synchronization algorithm, declared once: its family, graph, engine, simulator step and what it supports.

The config's validation, :func:`~gossip_accel.sync.topology.make_topology`, the
:class:`~gossip_accel.sync.synchronizer.Synchronizer` (which engine runs it), the engines (which
rule, lock-step or RPC), the simulator (which step), the benches and the algorithm tables of
docs/ALGORITHMS.md (checked by tests/test_registry.py) read this table; nothing else tests an
algorithm's name. A new algorithm is one rule file in ``algorithms/``, one entry here, and its
oracle test (the simulator against real workers).

This module is pure data: it imports nothing of the package.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: the families; each has one engine (engines/) and one simulator step (simulate.py)
FAMILIES = ("periodic", "server", "pairwise")
#: who is averaged with whom: all workers, the ring of Definition 1 (or ADPSGD's pairs on it), a server's star
GRAPHS = ("full", "ring", "server")


@dataclass(frozen=True)
class Algorithm:
    """One value of ``sync.algorithm``.

    ``family``: periodic (Algorithm 1 of 000), server (001: EASGD eq. 8/9, ASGD eq. 2) or pairwise
    (ADPSGD, 002/004). ``engine`` / ``simulator``: the key of the engine (``engines.engine_class``)
    and of the simulator step (``simulate.SimulatedCluster``) that run it. ``rule``: the module of
    ``algorithms/`` with its update rule. ``bmuf_slots``: keeps omega and Delta (lines 10-13).
    ``all_neighbours``: ring with q = 2p ("local"). ``pairing``: ADPSGD's pattern (fixed / random).
    ``delayed``: the exchange of round r is applied at round r + 1. ``asynchronous``: runs over
    torch.distributed.rpc unless ``sync.lockstep`` (then in a deterministic lock-step order).
    ``warmup`` / ``low_precision_wire`` / ``hierarchy``: ``sync.warmup_steps``,
    ``sync.exchange_dtype`` other than float32, ``sync.hierarchy.group_size`` > 1 are implemented.
    ``nonfinite``: what ``sync.nonfinite=reset`` does for it (health.py). ``outer_optimizer``: its slots
    may hold a torch optimizer on the outer gradient instead of the BMUF rule (``sync.outer_optimizer``,
    algorithms/outer.py). ``overlap``: ``sync.stagger`` and ``sync.overlap_steps`` > 0 are implemented
    (schedule.py, overlap.py).
    """

    name: str
    family: str
    graph: str
    rule: str
    nonfinite: str
    bmuf_slots: bool = False
    all_neighbours: bool = False
    pairing: Optional[str] = None
    delayed: bool = False
    asynchronous: bool = False
    warmup: bool = False
    low_precision_wire: bool = False
    hierarchy: bool = False
    outer_optimizer: bool = False
    overlap: bool = False
    engine: str = ""
    simulator: str = ""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES or self.graph not in GRAPHS:
            raise ValueError(f"algorithm {self.name!r}: family {self.family!r} / graph {self.graph!r} unknown")
        # the family's engine and simulator step unless the entry names others (an overlapped engine, say)
        object.__setattr__(self, "engine", self.engine or self.family)
        object.__setattr__(self, "simulator", self.simulator or self.family)

    @property
    def deepspeed(self) -> str:
        """What the DeepSpeed integration accepts (integrations/deepspeed.py: check_engine)."""
        if self.asynchronous:
            return "ZeRO-0 fp32; fp16/bf16 and replica groups with sync.lockstep"
        return "ZeRO-0 fp32/fp16/bf16, ZeRO-1/2 replica groups"

    @property
    def lockstep(self) -> str:
        """How it is ordered: always lock-step, or asynchronous unless ``sync.lockstep``."""
        return "sync.lockstep: true (default: RPC)" if self.asynchronous else "always"


_MEAN = "masked mean over the healthy ranks"
_RING = "non-finite copies dropped; a sick rank restarts from its neighbours' mean"


def _periodic(name: str, graph: str, rule: str, all_neighbours: bool = False) -> Algorithm:
    """Algorithm 1 of 000: every H_i steps an average over the graph, then the rule."""
    return Algorithm(name, "periodic", graph, rule, _MEAN if graph == "full" else _RING,
                     bmuf_slots=rule == "bmuf", all_neighbours=all_neighbours, warmup=True,
                     low_precision_wire=True, hierarchy=True, outer_optimizer=rule == "bmuf", overlap=True)


_SERVER = "the server rejects a non-finite push; a sick worker restarts from the reply"
_PAIR = "a non-finite partner copy is dropped; a sick worker resets to its partner's"

ALGORITHMS: tuple[Algorithm, ...] = (
    _periodic("ma", "full", "ma"),
    _periodic("bmuf", "full", "bmuf"),
    _periodic("local_ma", "ring", "ma", all_neighbours=True),
    _periodic("local_bmuf", "ring", "bmuf", all_neighbours=True),
    _periodic("gossip_ma", "ring", "ma"),
    _periodic("gossip_bmuf", "ring", "bmuf"),
    Algorithm("easgd", "server", "server", "easgd", "sick workers send zeros (flag all-reduce) and restart "
              "from the centre"),
    Algorithm("easgd_async", "server", "server", "easgd", _SERVER, asynchronous=True),
    Algorithm("asgd", "server", "server", "asgd", _SERVER, asynchronous=True),
    Algorithm("adpsgd_fixed", "pairwise", "ring", "adpsgd", _PAIR, pairing="fixed", asynchronous=True),
    Algorithm("adpsgd_random", "pairwise", "ring", "adpsgd", _PAIR, pairing="random", asynchronous=True),
    Algorithm("adpsgd_delay", "pairwise", "ring", "adpsgd", _PAIR, pairing="fixed", delayed=True, asynchronous=True),
)

_BY_NAME = {a.name: a for a in ALGORITHMS}


def names(**where: object) -> tuple[str, ...]:
    """The algorithms' names in declaration order, those whose fields equal ``where`` (e.g. ``warmup=True``)."""
    return tuple(a.name for a in ALGORITHMS if all(getattr(a, k) == v for k, v in where.items()))


def unknown(name: str) -> str:
    """The error message for an unknown ``sync.algorithm``."""
    return f"sync.algorithm={name!r} is unknown; choose one of {', '.join(names())}"


def get(name: str) -> Algorithm:
    """The entry of ``sync.algorithm=name``; an unknown name is a :class:`KeyError` listing the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(unknown(name)) from None


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


#: the columns of :func:`support_table` (docs/ALGORITHMS.md holds its output)
SUPPORT_COLUMNS = ("`sync.algorithm`", "family / engine", "graph", "rule (`algorithms/`)", "BMUF slots",
                   "outer optimizer", "warm-up", "bf16/fp16 wire", "hierarchy", "stagger / overlap", "lock-step", "DeepSpeed", "`sync.nonfinite=reset`")


def support_table() -> str:
    """The markdown table of docs/ALGORITHMS.md "What each algorithm supports" (tests/test_registry.py)."""
    rows = ["| " + " | ".join(SUPPORT_COLUMNS) + " |", "|" + "---|" * len(SUPPORT_COLUMNS)]
    for a in ALGORITHMS:
        family = a.family if a.engine == a.family else f"{a.family} / {a.engine}"
        cells = (f"`{a.name}`", family, a.graph + (f" ({a.pairing} pairs)" if a.pairing else ""), f"`{a.rule}.py`",
                 _yes(a.bmuf_slots), _yes(a.outer_optimizer), _yes(a.warmup), _yes(a.low_precision_wire), _yes(a.hierarchy), _yes(a.overlap), a.lockstep,
                 a.deepspeed, a.nonfinite)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
