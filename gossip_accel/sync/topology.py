"""Communication graphs and the seeded neighbour sampling of gossip rounds.

* :class:`RingTopology` is the k-symmetric ring of Definition 1 (000_07fa007f7f1023ae.txt):
  node i is connected to (i-1)%n, ..., (i-k)%n, (i+1)%n, ..., (i+k)%n.
* In every sync round of component c each node k draws ``q`` of its ``2p`` neighbours
  (Algorithm 1, line 7). The draw is a pure function of (seed, component, round, node),
  so every rank computes every node's choice without communicating, and therefore also
  knows to whom it must send. ``q == 2p`` selects all neighbours ("local" variants).
* :class:`FullTopology` is the fully connected graph: the average over all n nodes
  (classic MA / BMUF), and the star of a parameter server (EASGD, ASGD).
* :class:`PairTopology` is ADPSGD's ring (Cui et al. 2021, 002/004): in every round each node
  averages with exactly one ring neighbour. Even ranks are *active* (they initiate the
  average), odd ranks *passive* (they answer), the bipartite split that keeps asynchronous
  ADPSGD free of deadlocks. ``fixed``: actives alternate between their right and left
  neighbour; ``random``: actives are matched with passives by a random permutation drawn
  from (seed, round), like the gossip draws a pure function that every rank can compute.
* :class:`PairedRingTopology` (``sync.mixing: pair``) replaces the one-way pull of Algorithm 1
  line 7 by a random matching of ring neighbours: both ends of a pair average, so the round's
  mixing matrix is symmetric and doubly stochastic and the global mean is preserved.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import registry


class TopologyError(ValueError):
    """An impossible graph: the message says which parameter to change."""


@dataclass(frozen=True)
class Plan:
    """Who talks to whom in one round of one component.

    ``recv_from[k]``: the nodes whose copies node k averages with its own (sorted).
    ``send_to[k]``:   the nodes that chose k, i.e. to which k must send its copy (sorted).
    """

    recv_from: tuple[tuple[int, ...], ...]
    send_to: tuple[tuple[int, ...], ...]


class FullTopology:
    """Every node averages with all others (MA/BMUF); one all-reduce per round."""

    is_full = True

    def __init__(self, n: int):
        if n < 1:
            raise TopologyError(f"number of workers n={n} must be >= 1")
        self.n = n


class RingTopology:
    """p-symmetric ring of Definition 1 with q random neighbours per round (Algorithm 1)."""

    is_full = False

    def __init__(self, n: int, p: int, q: int, seed: int = 0):
        if n < 2:
            raise TopologyError(
                f"gossip/local algorithms need n >= 2 workers (got n={n}); "
                "use sync.algorithm=ma/bmuf or run more processes"
            )
        if p < 1:
            raise TopologyError(f"symmetric degree p={p} must be >= 1")
        if 2 * p >= n:
            fix = (f"use sync.p <= {(n - 1) // 2} for n={n}" if n >= 3 else
                   f"a ring needs n >= 3 workers, this run has {n}")
            raise TopologyError(
                f"2p >= n (p={p}, n={n}): the ring would connect a node to itself or twice; "
                f"{fix} (or sync.algorithm=ma/bmuf, which average over all workers)"
            )
        if not 1 <= q <= 2 * p:
            raise TopologyError(f"q={q} must satisfy 1 <= q <= 2p = {2 * p} (p={p})")
        self.n, self.p, self.q, self.seed = n, p, q, seed

    def neighbours(self, k: int) -> tuple[int, ...]:
        """All 2p neighbours of node k, in the order (k-1, ..., k-p, k+1, ..., k+p) % n."""
        n, p = self.n, self.p
        return tuple((k - d) % n for d in range(1, p + 1)) + tuple((k + d) % n for d in range(1, p + 1))

    def choose(self, k: int, component: int, round_: int) -> tuple[int, ...]:
        """The q neighbours node k averages with in ``round_`` of ``component`` (sorted).

        Uses numpy's SeedSequence on (seed, component, round, k): identical on every rank,
        independent across nodes, components and rounds.
        """
        nbrs = self.neighbours(k)
        if self.q == len(nbrs):
            return tuple(sorted(nbrs))
        rng = np.random.default_rng([self.seed, component, round_, k])
        picked = rng.choice(len(nbrs), size=self.q, replace=False)
        return tuple(sorted(nbrs[i] for i in picked))

    def plan(self, component: int, round_: int) -> Plan:
        """Choices of all nodes in one round, and the senders' view of them."""
        recv = tuple(self.choose(k, component, round_) for k in range(self.n))
        send: list[list[int]] = [[] for _ in range(self.n)]
        for k, chosen in enumerate(recv):
            for j in chosen:
                send[j].append(k)
        return Plan(recv_from=recv, send_to=tuple(tuple(sorted(s)) for s in send))


class PairedRingTopology(RingTopology):
    """``sync.mixing: pair``: each round a random matching on the p-symmetric ring; partners average.

    The paper's pull (Algorithm 1 line 7) lets node k average with q nodes it chose, but nobody
    averages with k in return unless it chose k too: the round's mixing matrix W is row- but not
    column-stochastic, so the mean (1/n) sum_k theta_k drifts. Here the round draws a maximal
    matching M of the ring's edges {(k, k+d): d = 1..p} (greedy over the edges in an order seeded by
    (seed, component, round), the same on every rank), and every pair (a, b) in M computes
    theta_bar = (theta_a + theta_b) / 2: W = I - sum_{(a,b) in M} (e_a - e_b)(e_a - e_b)^T / 2 is
    symmetric and doubly stochastic. A node the matching leaves out keeps its model that round
    (it still applies the rule of its schedule event to its own theta). Traffic equals q = 1 pull.
    """

    mixing = "pair"

    def __init__(self, n: int, p: int, seed: int = 0):
        super().__init__(n, p, 1, seed)

    def matching(self, component: int, round_: int) -> tuple[tuple[int, int], ...]:
        """The pairs (a, b), a < b, of ``round_`` of ``component``: a maximal matching of ring edges."""
        n, p = self.n, self.p
        edges = [(k, (k + d) % n) for d in range(1, p + 1) for k in range(n)]
        order = np.random.default_rng([self.seed, component, round_, n, 2]).permutation(len(edges))
        free = [True] * n
        pairs = []
        for e in order:
            a, b = edges[e]
            if free[a] and free[b]:
                free[a] = free[b] = False
                pairs.append((min(a, b), max(a, b)))
        return tuple(sorted(pairs))

    def plan(self, component: int, round_: int) -> Plan:
        partner: list[tuple[int, ...]] = [()] * self.n
        for a, b in self.matching(component, round_):
            partner[a], partner[b] = (b,), (a,)
        return Plan(recv_from=tuple(partner), send_to=tuple(partner))


class PairTopology:
    """ADPSGD's pairing on a ring of n (even) nodes: one partner per node and round.

    Round r (1-based sync count) pairs node k with ``partner(k, r)``; the pairs of a round
    form a perfect matching between the actives (even ranks) and the passives (odd ranks),
    so the mixing matrix W_r (1/2 on each pair) is symmetric and doubly stochastic.

    * ``fixed``: round r pairs (r + 2m, r + 2m + 1) % n, m = 0..n/2-1: every node talks to its
      right neighbour in one round and to its left neighbour in the next.
    * ``random``: the passives are permuted by numpy's generator seeded with (seed, r) and
      passive ``perm[m]`` is paired with active 2m.
    """

    is_full = False

    def __init__(self, n: int, pattern: str = "fixed", seed: int = 0):
        if n < 2 or n % 2:
            raise TopologyError(
                f"ADPSGD pairs every active (even rank) with a passive (odd rank) and needs an even "
                f"number of workers n >= 2 (got n={n}); run an even number of processes"
            )
        if pattern not in ("fixed", "random"):
            raise TopologyError(f"ADPSGD pattern {pattern!r}; choose fixed or random")
        self.n, self.pattern, self.seed = n, pattern, seed

    @staticmethod
    def is_active(k: int) -> bool:
        """Actives (even ranks) start every pairwise average; passives (odd ranks) answer."""
        return k % 2 == 0

    def pairs(self, round_: int) -> tuple[tuple[int, int], ...]:
        """(active, passive) pairs of ``round_``, sorted by the active's rank."""
        n = self.n
        if self.pattern == "fixed":
            raw = [((round_ + 2 * m) % n, (round_ + 2 * m + 1) % n) for m in range(n // 2)]
            return tuple(sorted((a, b) if a % 2 == 0 else (b, a) for a, b in raw))
        rng = np.random.default_rng([self.seed, round_])
        passives = rng.permutation(np.arange(1, n, 2))
        return tuple((2 * m, int(passives[m])) for m in range(n // 2))

    def partner(self, k: int, round_: int) -> int:
        for a, b in self.pairs(round_):
            if k == a:
                return b
            if k == b:
                return a
        raise AssertionError("every node has a partner")  # pragma: no cover


def make_topology(algorithm: str, n: int, p: int, q: int, seed: int, mixing: str = "pull"):
    """Topology for a configured algorithm, from its registry entry: the full graph (MA/BMUF, and the
    star of the server algorithms), ADPSGD's pairs (its pairing pattern), the p-symmetric ring otherwise
    (``mixing="pair"``: its random matchings, :class:`PairedRingTopology`)."""
    spec = registry.get(algorithm)
    if spec.graph in ("full", "server"):
        return FullTopology(n)
    if spec.pairing is not None:
        return PairTopology(n, spec.pairing, seed)
    if spec.all_neighbours and q != 2 * p:
        gossip = registry.names(family=spec.family, graph="ring", rule=spec.rule, all_neighbours=False)
        raise TopologyError(
            f"{algorithm} averages with all 2p={2 * p} ring neighbours, but q={q}; "
            f"drop sync.q or use {' / '.join(gossip)} for q < 2p"
        )
    if mixing == "pair":
        if q != 1:
            raise TopologyError(f"sync.mixing=pair gives every node one partner per round, but q={q}; "
                                "drop sync.q (or set it to 1), or use sync.mixing=pull")
        return PairedRingTopology(n, p, seed)
    return RingTopology(n, p, q, seed)
