"""Definition 1 (k-symmetric ring) and the seeded neighbour draw of Algorithm 1, line 7."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest

from gossip_accel.sync.topology import FullTopology, Plan, RingTopology, TopologyError, make_topology


# -- Definition 1: node i is connected to (i-1)%n..(i-k)%n and (i+1)%n..(i+k)%n --------------
@pytest.mark.parametrize(
    "n, p, node, expected",
    [
        (8, 2, 0, (7, 6, 1, 2)),
        (8, 2, 7, (6, 5, 0, 1)),
        (8, 2, 3, (2, 1, 4, 5)),
        (5, 1, 0, (4, 1)),
        (5, 1, 4, (3, 0)),
        (3, 1, 0, (2, 1)),
        (3, 1, 2, (1, 0)),
        (7, 3, 0, (6, 5, 4, 1, 2, 3)),
        (16, 3, 14, (13, 12, 11, 15, 0, 1)),
        (16, 3, 1, (0, 15, 14, 2, 3, 4)),
        (4, 1, 2, (1, 3)),
    ],
)
def test_neighbours_definition_1(n, p, node, expected):
    topo = RingTopology(n, p, q=1)
    assert topo.neighbours(node) == expected


@pytest.mark.parametrize("n, p", [(3, 1), (4, 1), (5, 2), (8, 2), (8, 3), (16, 3), (16, 7)])
def test_neighbourhood_is_symmetric_and_has_2p_distinct_nodes(n, p):
    topo = RingTopology(n, p, q=1)
    for k in range(n):
        nb = topo.neighbours(k)
        assert len(nb) == 2 * p == len(set(nb))
        assert k not in nb
        for j in nb:  # the relation is symmetric: j is a neighbour of k iff k is one of j
            assert k in topo.neighbours(j)
        # ring distance of every neighbour is 1..p
        assert sorted(min((j - k) % n, (k - j) % n) for j in nb) == sorted(list(range(1, p + 1)) * 2)


@pytest.mark.parametrize("n, p", [(4, 1), (8, 2), (16, 3), (9, 4)])
def test_q_equals_2p_returns_all_neighbours(n, p):
    topo = RingTopology(n, p, q=2 * p, seed=3)
    for comp in range(3):
        for rnd in range(1, 6):
            for k in range(n):
                assert topo.choose(k, comp, rnd) == tuple(sorted(topo.neighbours(k)))


# -- choose(): a pure function of (seed, component, round, node) -------------------------------
def test_choose_is_pure_and_reproducible_across_instances():
    a = RingTopology(16, 3, 2, seed=11)
    b = RingTopology(16, 3, 2, seed=11)
    for comp, rnd in itertools.product(range(3), range(1, 8)):
        plan = a.plan(comp, rnd)
        assert b.plan(comp, rnd) == plan
        for k in range(16):
            first = a.choose(k, comp, rnd)
            assert a.choose(k, comp, rnd) == first  # same object, same args
            assert b.choose(k, comp, rnd) == first  # fresh object, same seed
            assert plan.recv_from[k] == first


def test_choose_is_sorted_and_of_size_q():
    topo = RingTopology(16, 3, 4, seed=1)
    for rnd in range(1, 30):
        for k in range(16):
            c = topo.choose(k, 0, rnd)
            assert len(c) == 4 == len(set(c))
            assert list(c) == sorted(c)


def test_choose_differs_across_rounds_components_nodes_and_seeds():
    topo = RingTopology(8, 2, 2, seed=0)
    by_round = {topo.choose(0, 0, r) for r in range(1, 40)}
    assert len(by_round) > 1  # the draw changes from round to round
    by_comp = {topo.choose(0, c, 1) for c in range(40)}
    assert len(by_comp) > 1  # ... and from component to component
    # same round/component: different nodes draw independently (different offsets)
    offsets = {tuple(sorted((j - k) % 8 for j in topo.choose(k, 0, 1))) for k in range(8)}
    assert len(offsets) > 1
    other = RingTopology(8, 2, 2, seed=1)
    assert any(topo.choose(k, c, r) != other.choose(k, c, r)
               for k in range(8) for c in range(2) for r in range(1, 10))


# -- plan(): receivers and senders -------------------------------------------------------------
@pytest.mark.parametrize("n, p, q, seed", [(4, 1, 1, 0), (8, 2, 2, 5), (8, 2, 3, 1), (16, 3, 2, 7), (5, 2, 4, 2)])
def test_plan_invariants(n, p, q, seed):
    topo = RingTopology(n, p, q, seed)
    for comp in range(3):
        for rnd in range(1, 25):
            plan = topo.plan(comp, rnd)
            assert isinstance(plan, Plan)
            assert len(plan.recv_from) == len(plan.send_to) == n
            edges_recv = set()
            for k in range(n):
                chosen = plan.recv_from[k]
                assert len(chosen) == q == len(set(chosen))  # exactly q distinct nodes
                assert k not in chosen  # never itself
                assert set(chosen) <= set(topo.neighbours(k))  # only ring neighbours
                assert list(chosen) == sorted(chosen)
                edges_recv |= {(k, j) for j in chosen}
            edges_send = set()
            for j in range(n):
                assert list(plan.send_to[j]) == sorted(plan.send_to[j])
                assert len(plan.send_to[j]) == len(set(plan.send_to[j]))
                assert j not in plan.send_to[j]
                edges_send |= {(k, j) for k in plan.send_to[j]}
            # send_to is exactly the inverse relation of recv_from
            assert edges_recv == edges_send
            assert sum(len(s) for s in plan.send_to) == n * q


def test_plan_by_hand_for_local_variant():
    topo = RingTopology(5, 1, 2)
    plan = topo.plan(0, 1)
    assert plan.recv_from == ((1, 4), (0, 2), (1, 3), (2, 4), (0, 3))
    assert plan.send_to == plan.recv_from  # everyone sends to all neighbours


# -- the draw is uniform over the 2p neighbours ------------------------------------------------
@pytest.mark.parametrize("n, p, q", [(8, 2, 2), (16, 3, 1), (8, 2, 1)])
def test_choice_frequencies_are_uniform(n, p, q):
    rounds = 4000
    topo = RingTopology(n, p, q, seed=42)
    node = 3
    counts = Counter()
    subsets = Counter()
    for rnd in range(1, rounds + 1):
        chosen = topo.choose(node, 1, rnd)
        counts.update(chosen)
        subsets[chosen] += 1
    assert set(counts) == set(topo.neighbours(node))
    for j in topo.neighbours(node):
        assert abs(counts[j] / rounds - q / (2 * p)) < 0.05, (j, counts[j] / rounds)
    # every q-subset of the neighbours is about equally likely
    n_subsets = len(list(itertools.combinations(range(2 * p), q)))
    assert len(subsets) == n_subsets
    for s, c in subsets.items():
        assert abs(c / rounds - 1 / n_subsets) < 0.05, (s, c / rounds)


def test_choice_uniform_across_nodes_in_one_round_family():
    # over nodes and rounds: each ring offset (-2, -1, +1, +2) is drawn with frequency q/2p
    n, p, q = 8, 2, 2
    topo = RingTopology(n, p, q, seed=9)
    counts = Counter()
    total = 0
    for rnd in range(1, 501):
        for k in range(n):
            for j in topo.choose(k, 2, rnd):
                counts[(j - k) % n] += 1
            total += 1
    assert set(counts) == {1, 2, 6, 7}
    for off, c in counts.items():
        assert abs(c / total - q / (2 * p)) < 0.05, (off, c / total)


# -- errors ------------------------------------------------------------------------------------
def test_q_larger_than_2p_is_an_error():
    with pytest.raises(TopologyError, match=r"q=5"):
        RingTopology(8, 2, 5)


def test_q_below_one_is_an_error():
    with pytest.raises(TopologyError, match=r"q=0"):
        RingTopology(8, 2, 0)
    with pytest.raises(TopologyError, match=r"q=-1"):
        RingTopology(8, 2, -1)


@pytest.mark.parametrize("n, p", [(4, 2), (6, 3), (2, 1), (8, 4), (8, 5)])
def test_2p_at_least_n_is_an_error(n, p):
    with pytest.raises(TopologyError) as e:
        RingTopology(n, p, 1)
    msg = str(e.value)
    assert f"p={p}" in msg and f"n={n}" in msg


def test_single_node_ring_is_an_error():
    with pytest.raises(TopologyError, match=r"n=1"):
        RingTopology(1, 1, 1)
    with pytest.raises(TopologyError, match=r"n=0"):
        RingTopology(0, 1, 1)


def test_p_below_one_is_an_error():
    with pytest.raises(TopologyError, match=r"p=0"):
        RingTopology(8, 0, 1)


def test_topology_error_is_a_value_error():
    assert issubclass(TopologyError, ValueError)


def test_full_topology():
    t = FullTopology(4)
    assert t.n == 4 and t.is_full
    assert FullTopology(1).n == 1
    with pytest.raises(TopologyError, match=r"n=0"):
        FullTopology(0)


# -- make_topology -----------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["ma", "bmuf"])
def test_make_topology_full_for_ma_and_bmuf(algo):
    t = make_topology(algo, 8, 2, 1, 0)
    assert isinstance(t, FullTopology) and t.n == 8
    # the ring parameters are irrelevant for the full graph (even impossible ones)
    assert isinstance(make_topology(algo, 2, 5, 7, 0), FullTopology)
    assert isinstance(make_topology(algo, 1, 1, 1, 0), FullTopology)


@pytest.mark.parametrize("algo", ["local_ma", "local_bmuf"])
def test_make_topology_local_requires_q_2p(algo):
    t = make_topology(algo, 8, 2, 4, 3)
    assert isinstance(t, RingTopology)
    assert (t.n, t.p, t.q, t.seed) == (8, 2, 4, 3)
    assert not t.is_full
    with pytest.raises(TopologyError) as e:
        make_topology(algo, 8, 2, 2, 0)
    assert "q=2" in str(e.value) and algo in str(e.value)


@pytest.mark.parametrize("algo", ["gossip_ma", "gossip_bmuf"])
def test_make_topology_gossip_is_ring(algo):
    t = make_topology(algo, 16, 3, 2, 5)
    assert isinstance(t, RingTopology)
    assert (t.n, t.p, t.q, t.seed) == (16, 3, 2, 5)
    # gossip with q = 2p is allowed (it degenerates to local)
    assert make_topology(algo, 8, 2, 4, 0).q == 4
    with pytest.raises(TopologyError, match=r"n=1"):
        make_topology(algo, 1, 1, 1, 0)
    with pytest.raises(TopologyError, match=r"q=5"):
        make_topology(algo, 8, 2, 5, 0)


# -- sync.mixing=pair: random matchings of ring neighbours ----------------------------------------
@pytest.mark.parametrize("n,p", [(4, 1), (5, 1), (8, 1), (9, 2), (16, 3)])
def test_paired_ring_draws_a_maximal_matching_of_ring_edges(n, p):
    from gossip_accel.sync.topology import PairedRingTopology

    topo = make_topology("gossip_bmuf", n, p, 1, 7, mixing="pair")
    assert isinstance(topo, PairedRingTopology) and isinstance(topo, RingTopology)
    seen = Counter()
    for comp, rnd in itertools.product(range(3), range(1, 30)):
        pairs = topo.matching(comp, rnd)
        nodes = [k for pair in pairs for k in pair]
        assert len(nodes) == len(set(nodes))                      # a matching
        for a, b in pairs:
            assert b in topo.neighbours(a)                        # of ring edges
        free = set(range(n)) - set(nodes)
        assert not any(b in topo.neighbours(a) for a in free for b in free if a < b)  # maximal
        plan = topo.plan(comp, rnd)
        assert plan.recv_from == plan.send_to                     # both ends average: symmetric
        assert all(len(r) <= 1 for r in plan.recv_from)
        assert plan == topo.plan(comp, rnd)                       # a pure function of (seed, comp, round)
        seen.update(pairs)
    assert len(seen) == n * p                                     # every ring edge is used sometime
    if n % 2 == 0 and p == 1:
        assert all(len(topo.matching(0, r)) in (n // 2, n // 2 - 1) for r in range(1, 30))


def test_paired_ring_refuses_q_above_one():
    with pytest.raises(TopologyError, match="one partner"):
        make_topology("gossip_ma", 8, 2, 2, 0, mixing="pair")
