"""ADPSGD on a ring (Cui et al. 2021, 002/004): fixed and randomized pairing, delay-by-one.

The pairing (:class:`gossip_accel.sync.topology.PairTopology`), the pure rules, the simulator's
lock-step semantics (X_{r+1} = (X_r - eta G) W_r, and X_r W_r - eta G for delay-by-one), and
4 spawned workers running truly asynchronously over RPC: the sum of the models is conserved
(no average lost or applied twice), every request is served, the run trains and ends cleanly.
Lock-step equality with the simulator: the ``adpsgd_*_lockstep`` scenarios of
test_distributed_equals_simulator.py.
"""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync.algorithms import delayed_average, pair_average, passive_absorb
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.simulate import SimulatedCluster
from gossip_accel.sync.topology import PairTopology, TopologyError, make_topology

from harness import CONST, WORLD, async_results


def t(*v):
    return torch.tensor(v, dtype=torch.float32)


# -- pairing -------------------------------------------------------------------------------------
def test_fixed_pattern_alternates_right_and_left_neighbours():
    topo = PairTopology(6, "fixed")
    assert topo.pairs(2) == ((0, 1), (2, 3), (4, 5))
    assert topo.pairs(1) == ((0, 5), (2, 1), (4, 3))
    for r in range(1, 9):
        for k in range(6):
            j = topo.partner(k, r)
            assert j in ((k - 1) % 6, (k + 1) % 6)  # a ring neighbour
            assert topo.partner(j, r) == k
        assert topo.partner(0, r) != topo.partner(0, r + 1)  # right, then left


@pytest.mark.parametrize("n", [2, 4, 8])
def test_random_pattern_is_a_seeded_matching_of_actives_and_passives(n):
    topo = PairTopology(n, "random", seed=7)
    seen = set()
    for r in range(1, 30):
        pairs = topo.pairs(r)
        assert sorted(a for a, _ in pairs) == list(range(0, n, 2))
        assert sorted(b for _, b in pairs) == list(range(1, n, 2))
        assert pairs == PairTopology(n, "random", seed=7).pairs(r)  # a pure function of (seed, round)
        seen.add(pairs)
    if n >= 4:
        assert len(seen) > 1
    assert all(PairTopology.is_active(k) == (k % 2 == 0) for k in range(n))


def test_pairing_needs_an_even_number_of_workers():
    with pytest.raises(TopologyError, match="even"):
        PairTopology(5)
    with pytest.raises(TopologyError, match="even"):
        make_topology("adpsgd_fixed", 3, 1, 1, 0)
    assert make_topology("adpsgd_random", 4, 1, 1, 3).pattern == "random"
    assert make_topology("adpsgd_delay", 4, 1, 1, 3).pattern == "fixed"


def test_config_keys():
    cfg = load_sync_config(None, ["sync.algorithm=adpsgd_delay"])
    assert cfg.is_async and cfg.graph == "ring" and not cfg.uses_bmuf
    with pytest.raises(ConfigError, match="sync.warmup_steps"):
        load_sync_config(None, ["sync.algorithm=adpsgd_fixed", "sync.warmup_steps=2"])


# -- the rules -------------------------------------------------------------------------------------
def test_rules_by_hand():
    a, b = t(1.0, 4.0), t(3.0, 0.0)
    assert torch.equal(pair_average(a, b), t(2.0, 2.0))
    # delay-by-one: sent [1, 4], partner sent [3, 0], local progress +[0.5, 0.5] since then
    theta = t(1.5, 4.5)
    assert torch.equal(delayed_average(theta, t(1.0, 4.0), t(3.0, 0.0)), t(2.5, 2.5))


def test_passive_absorb_conserves_the_sum():
    published, pending, live_progress = t(2.0, 2.0), torch.zeros(2), t(0.25, -0.25)
    incoming = t(4.0, 0.0)
    reply = passive_absorb(published, pending, incoming)
    active = pair_average(incoming.clone(), reply)
    assert torch.equal(reply, t(2.0, 2.0)) and torch.equal(active, t(3.0, 1.0))
    assert torch.equal(published, t(3.0, 1.0))
    passive_live = t(2.0, 2.0) + live_progress + pending  # applied at the passive's next sync
    torch.testing.assert_close(active + passive_live, t(4.0, 0.0) + t(2.0, 2.0) + live_progress)
    # a second request before that sync averages with the updated published model
    reply2 = passive_absorb(published, pending, t(1.0, 1.0))
    assert torch.equal(reply2, t(3.0, 1.0)) and torch.equal(published, t(2.0, 1.0))


# -- the simulator ----------------------------------------------------------------------------------
CFG = {"components": [{"name": "all"}], "period": 1, "buffers": "local"}


def _const_run(algo, n=4, rounds=6, lr=0.0):
    """Every worker adds (k+1)/64 per step (a constant 'gradient'); returns per-round model lists."""
    models = [torch.nn.Linear(1, 1, bias=False) for _ in range(n)]
    with torch.no_grad():
        for k, m in enumerate(models):
            m.weight.fill_(float(k))
    cluster = SimulatedCluster(models, CFG, [f"sync.algorithm={algo}", "sync.broadcast_initial=false"])
    hist = [[float(m.weight.detach()) for m in models]]
    for _ in range(rounds):
        with torch.no_grad():
            for k, m in enumerate(models):
                m.weight.add_((k + 1) / 64)
        cluster.step()
        hist.append([float(m.weight.detach()) for m in models])
    return cluster, hist


def test_simulated_fixed_pattern_is_local_step_then_average():
    cluster, hist = _const_run("adpsgd_fixed")
    topo = cluster.topology
    x = [0.0, 1.0, 2.0, 3.0]
    for r in range(1, 7):
        y = [x[k] + (k + 1) / 64 for k in range(4)]  # X_r - eta G
        for a, b in topo.pairs(r):
            y[a] = y[b] = (y[a] + y[b]) / 2  # ... W_r
        x = y
        assert hist[r] == pytest.approx(x)


def test_simulated_delay_by_one_is_average_of_previous_round_plus_local_step():
    cluster, hist = _const_run("adpsgd_delay")
    topo = cluster.topology
    x = [0.0, 1.0, 2.0, 3.0]
    sent, pairs = None, None
    for r in range(1, 7):
        y = [x[k] + (k + 1) / 64 for k in range(4)]
        if sent is not None:  # X_r W_{r-1} - eta G: the exchange of round r-1 lands now
            partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}
            y = [y[k] + (sent[partner[k]] - sent[k]) / 2 for k in range(4)]
        sent, pairs = list(y), topo.pairs(r)
        x = y
        assert hist[r] == pytest.approx(x)
    # the sum over workers only moves by the local steps (mass conservation)
    assert sum(hist[-1]) == pytest.approx(6.0 + 6 * sum((k + 1) / 64 for k in range(4)))


@pytest.mark.parametrize("algo", ["adpsgd_fixed", "adpsgd_random", "adpsgd_delay"])
def test_simulated_replicas_reach_consensus_without_gradients(algo):
    models = [torch.nn.Linear(3, 2) for _ in range(4)]
    cluster = SimulatedCluster(models, CFG, [f"sync.algorithm={algo}", "sync.broadcast_initial=false"])
    mean = torch.stack([m.weight.detach().clone() for m in models]).mean(0)
    for _ in range(40):
        cluster.step()
    for m in models:
        torch.testing.assert_close(m.weight.detach(), mean, atol=1e-4, rtol=0)


# -- ADPSGD over RPC (4 spawned workers, once per session) ---------------------------------------------
@pytest.fixture(scope="module")
def res():
    return async_results()


@pytest.mark.parametrize("name", ["adpsgd_fixed_const", "adpsgd_random_const", "adpsgd_delay_const",
                                  "resume_adpsgd_delay_const"])
def test_async_adpsgd_conserves_the_sum_and_serves_every_request(res, name):
    # each pairwise average keeps x_active + x_passive: after finalize (pending corrections
    # applied, then the average of all replicas) every worker holds theta_0 + the mean local progress
    steps = res[0][name]["steps"]
    progress = sum((k + 1) * CONST * steps for k in range(WORLD)) / WORLD
    for r in range(WORLD):
        for key, theta0 in res[0][name]["initial"].items():
            if key.startswith("norm.running") or key.endswith("num_batches_tracked"):
                continue
            torch.testing.assert_close(res[r][name]["final"][key], theta0 + progress, atol=1e-5, rtol=0)
    reports = [res[r][name]["report_final"] for r in range(WORLD)]
    if name.startswith("resume_"):  # the served counters start again with the new RPC session
        assert all(rep["round"] == steps for rep in reports)
        return
    requests = {r: rep["requests"] for r, rep in enumerate(reports) if rep["active"]}
    served: dict[int, int] = {}
    for rep in reports:
        if not rep["active"]:
            for sender, count in rep["served"].items():
                served[sender] = served.get(sender, 0) + count
    assert requests == served  # every request of an active was answered by a passive, once
    assert all(rep["round"] == steps for rep in reports)  # period 1: one round per step


@pytest.mark.parametrize("name", ["adpsgd_fixed_train", "adpsgd_random_train", "adpsgd_delay_train"])
def test_async_adpsgd_trains(res, name):
    r0 = res[0][name]
    assert r0["heldout"] < 0.9 * r0["heldout_initial"]
    for r in range(1, WORLD):
        assert res[r][name]["heldout"] == pytest.approx(r0["heldout"])  # one final model
    active = res[0][name]["metrics"]
    assert active["sync/adpsgd/requests"] == res[0][name]["steps"]
    assert active["sync/bytes_sent"] > 0 and active["sync/bytes_recv"] == active["sync/bytes_sent"]
    passive = res[1][name]["metrics"]
    assert passive["sync/bytes_sent"] > 0  # the passive's replies are counted on its side
