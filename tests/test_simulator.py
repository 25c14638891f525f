"""The schedule (Algorithm 1 line 6, with warm-up) and the single-process simulator."""
from __future__ import annotations

import copy

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.config import ALGORITHMS
from gossip_accel.sync.schedule import Event, event_at
from gossip_accel.sync.simulate import SimulatedCluster, simulate
from gossip_accel.sync.topology import RingTopology, TopologyError

TOY_CFG = {"components": toy.TOY_COMPONENTS, "period": 4}  # embedding shards: H=8, rest: H=4


# -- schedule ----------------------------------------------------------------------------------
@pytest.mark.parametrize("H", [1, 3, 4, 16])
def test_event_at_without_warmup(H):
    for t in range(1, 5 * H + 2):
        ev = event_at(t, H, 0, 1)
        if t % H == 0:
            assert ev == Event("sync", t // H)
        else:
            assert ev is None


def test_event_at_with_warmup():
    H = 4
    got = {t: event_at(t, H, warmup_steps=6, warmup_period=2) for t in range(1, 20)}
    expected = {t: None for t in range(1, 20)}
    expected[2] = Event("warmup", 0)
    expected[4] = Event("warmup", 0)
    expected[6] = Event("warmup_end", 0)
    expected[10] = Event("sync", 1)
    expected[14] = Event("sync", 2)
    expected[18] = Event("sync", 3)
    assert got == expected


def test_event_at_warmup_end_off_the_warmup_grid():
    got = [event_at(t, 3, warmup_steps=5, warmup_period=2) for t in range(1, 12)]
    assert got == [None, Event("warmup", 0), None, Event("warmup", 0), Event("warmup_end", 0),
                   None, None, Event("sync", 1), None, None, Event("sync", 2)]


# -- helpers -----------------------------------------------------------------------------------
def make_models(n):
    return [toy.ToyModel(seed=k) for k in range(n)]


def opts_for(models, lr=0.05):
    return [torch.optim.SGD(m.parameters(), lr=lr) for m in models]


def local_steps(cluster, opts, t):
    for k, (m, o) in enumerate(zip(cluster.models, opts)):
        toy.train_step(m, o, 0, k, t)


def comp_values(cluster, name):
    out = []
    for comps in cluster.comps:
        (c,) = [c for c in comps if c.name == name]
        out.append(c.gather().clone())
    return out


def all_equal(vals):
    return all(torch.equal(vals[0], v) for v in vals[1:])


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- MA ----------------------------------------------------------------------------------------
def test_ma_sync_averages_due_component_only():
    n = 4
    cluster = SimulatedCluster(make_models(n), TOY_CFG, ["sync.algorithm=ma"])
    assert [c.name for c in cluster.comps[0]] == ["embedding.shard0", "embedding.shard1", "rest"]
    assert [c.period for c in cluster.comps[0]] == [8, 8, 4]
    opts = opts_for(cluster.models)
    for t in range(1, 9):
        local_steps(cluster, opts, t)
        pre = {name: comp_values(cluster, name) for name in ("embedding.shard0", "embedding.shard1", "rest")}
        for name, vals in pre.items():
            assert not all_equal(vals), (t, name)  # local steps on different data made them differ
        cluster.step()
        assert cluster.t == t
        for name, vals in pre.items():
            post = comp_values(cluster, name)
            H = 4 if name == "rest" else 8
            if t % H == 0:
                # Algorithm 1 line 15 with the full graph: every replica holds the mean
                assert all_equal(post), (t, name)
                torch.testing.assert_close(post[0], torch.stack(vals).mean(0), atol=1e-6, rtol=0)
            else:
                assert not all_equal(post), (t, name)  # not due: untouched
                for a, b in zip(post, vals):
                    assert torch.equal(a, b)
        if t == 4:
            # rest is identical on all replicas, the embedding (period 8) still differs
            for k in range(1, n):
                assert torch.equal(cluster.models[k].hidden.weight, cluster.models[0].hidden.weight)
                assert torch.equal(cluster.models[k].out.bias, cluster.models[0].out.bias)
            assert not torch.equal(cluster.models[1].embedding.weight, cluster.models[0].embedding.weight)


def test_buffers_are_averaged_with_the_shortest_period():
    n = 3
    cluster = SimulatedCluster(make_models(n), TOY_CFG, ["sync.algorithm=ma"])
    assert cluster.bufs[0].period == 4
    opts = opts_for(cluster.models)
    for t in range(1, 5):
        local_steps(cluster, opts, t)
        pre = [m.norm.running_mean.clone() for m in cluster.models]
        cluster.step()
        post = [m.norm.running_mean.clone() for m in cluster.models]
        if t < 4:
            assert not all_equal(post)
        else:
            assert all_equal(post)
            torch.testing.assert_close(post[0], torch.stack(pre).mean(0), atol=1e-6, rtol=0)
    # num_batches_tracked is an integer buffer: it stays local (and equal anyway)
    assert all(int(m.norm.num_batches_tracked) == 4 for m in cluster.models)


def test_local_buffer_policy_keeps_buffers_apart():
    cluster = SimulatedCluster(make_models(3), TOY_CFG, ["sync.algorithm=ma", "sync.buffers=local"])
    assert cluster.bufs == [None, None, None]
    opts = opts_for(cluster.models)
    for t in range(1, 5):
        local_steps(cluster, opts, t)
        cluster.step()
    assert not all_equal([m.norm.running_mean.clone() for m in cluster.models])
    assert all_equal([m.hidden.weight.detach().clone() for m in cluster.models])


# -- BMUF on the full graph ----------------------------------------------------------------------
@pytest.mark.parametrize("nesterov", [True, False])
def test_bmuf_keeps_replicas_identical_and_follows_the_equations(nesterov):
    n, H = 4, 2
    cfg = {"components": [{"name": "all"}], "period": H}
    cluster = SimulatedCluster(make_models(n), cfg, ["sync.algorithm=bmuf", f"sync.nesterov={str(nesterov).lower()}"])
    eta, zeta = cluster.block_momentum, cluster.cfg.block_lr
    assert eta == pytest.approx(0.75)  # zeta * n * (1 - eta) = 1 with n = 4
    opts = opts_for(cluster.models)
    theta0 = cluster.comps[0][0].gather().clone().double()
    omega, delta, local = theta0.clone(), torch.zeros_like(theta0), theta0.clone()
    for t in range(1, 9):
        local_steps(cluster, opts, t)
        pre = comp_values(cluster, "all")
        cluster.step()
        post = comp_values(cluster, "all")
        if t % H:
            assert not all_equal(post)
            continue
        assert all_equal(post)  # every worker ran the same filter on the same average
        bar = torch.stack(pre).double().mean(0)
        G = bar - local                       # line 10
        delta = eta * delta + zeta * G        # line 11
        omega = omega + delta                 # line 12
        local = omega + eta * delta if nesterov else omega.clone()  # line 13
        torch.testing.assert_close(post[0].double(), local, atol=1e-5, rtol=1e-5)
        for k in range(n):
            torch.testing.assert_close(cluster.slots[k]["all"].omega.double(), omega, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cluster.slots[k]["all"].delta.double(), delta, atol=1e-5, rtol=1e-5)


def test_bmuf_with_eta_0_zeta_1_equals_ma():
    kw = dict(n=3, steps=12, config=TOY_CFG, finalize=False)
    step = lambda m, o, k, t: toy.train_step(m, o, 0, k, t)  # noqa: E731
    ma = simulate(toy.ToyModel, lambda m: torch.optim.SGD(m.parameters(), lr=0.05), step,
                  overrides=["sync.algorithm=ma"], **kw)
    bm = simulate(toy.ToyModel, lambda m: torch.optim.SGD(m.parameters(), lr=0.05), step,
                  overrides=["sync.algorithm=bmuf", "sync.block_momentum=0.0", "sync.block_lr=1.0"], **kw)
    for a, b in zip(ma.models, bm.models):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5, msg=name)


def test_warmup_averages_then_restarts_bmuf_slots():
    n = 3
    cfg = {"components": [{"name": "all"}], "period": 4, "warmup_steps": 6, "warmup_period": 2}
    cluster = SimulatedCluster(make_models(n), cfg, ["sync.algorithm=gossip_bmuf"])
    opts = opts_for(cluster.models)
    slot_omega0 = cluster.slots[0]["all"].omega.clone()
    for t in range(1, 11):
        local_steps(cluster, opts, t)
        pre = comp_values(cluster, "all")
        cluster.step()
        post = comp_values(cluster, "all")
        if t in (2, 4, 6):  # full average over all workers during warm-up
            assert all_equal(post)
            torch.testing.assert_close(post[0], torch.stack(pre).mean(0), atol=1e-6, rtol=0)
        if t in (2, 4):
            assert torch.equal(cluster.slots[0]["all"].omega, slot_omega0)  # slots untouched
        if t == 6:
            for k in range(n):  # omega <- theta_bar, Delta <- 0
                assert torch.equal(cluster.slots[k]["all"].omega, post[k])
                assert torch.equal(cluster.slots[k]["all"].delta, torch.zeros_like(post[k]))
        if t in (1, 3, 5, 7, 8, 9):
            assert not all_equal(post)
    # t = 10 = 6 + H: the first gossip round (round 1); with n=3, p=1, q=1 the replicas differ
    assert not torch.equal(cluster.slots[0]["all"].delta, torch.zeros_like(cluster.slots[0]["all"].delta))



# -- outer optimizers (sync.outer_optimizer) --------------------------------------------------------
OUTER_NESTEROV = "sync.outer_optimizer={name: SGD, lr: 1.0, momentum: 0.75, nesterov: true}"


@pytest.mark.parametrize("algo", ["bmuf", "gossip_bmuf", "local_bmuf"])
def test_outer_nesterov_sgd_equals_bmuf_nbm_in_the_simulator(algo):
    """The outer-optimizer form with SGD(lr=zeta, momentum=eta, nesterov) is BMUF-NBM with eta, zeta."""
    kw = dict(n=4, steps=26, config={**TOY_CFG, "warmup_steps": 6, "warmup_period": 2}, finalize=False)
    step = lambda m, o, k, t: toy.train_step(m, o, 0, k, t)  # noqa: E731
    opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5)  # noqa: E731
    bm = simulate(toy.ToyModel, opt, step, overrides=[f"sync.algorithm={algo}", "sync.p=1", "sync.block_momentum=0.75",
                                                      "sync.block_lr=1.0"], **kw)
    out = simulate(toy.ToyModel, opt, step, overrides=[f"sync.algorithm={algo}", "sync.p=1", OUTER_NESTEROV], **kw)
    assert type(out.slots[0]["rest"]).__name__ == "OuterSlots"
    for a, b in zip(bm.models, out.models):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5, msg=name)
    if algo != "bmuf":  # the replicas really differ (each node its own p and momentum)
        assert not torch.equal(out.models[0].hidden.weight, out.models[1].hidden.weight)


# -- gossip / local ------------------------------------------------------------------------------
RING_CFG = {"components": [{"name": "a", "pattern": r"^hidden\."}, {"name": "rest"}], "period": 2}


def gossip_rounds(cluster, steps: int):
    """Train ``steps`` steps; after each sync round yield (plan, before, after) per component,
    before/after being every replica's copy of it."""
    opts = opts_for(cluster.models)
    for t in range(1, steps + 1):
        local_steps(cluster, opts, t)
        pre = {name: comp_values(cluster, name) for name in ("a", "rest")}
        cluster.step()
        if t % 2 == 0:
            for ci, name in enumerate(("a", "rest")):
                yield cluster.topology.plan(ci, t // 2), pre[name], comp_values(cluster, name)


def assert_line_8(plan, pre, post):
    """theta_bar^k = the mean of k's own copy and those it received (Algorithm 1 line 8)."""
    for k in range(len(pre)):
        expected = torch.stack([pre[j] for j in (k, *plan.recv_from[k])]).mean(0)
        torch.testing.assert_close(post[k], expected, atol=1e-6, rtol=1e-6)


def test_gossip_average_is_line_8_on_the_ring():
    cluster = SimulatedCluster(make_models(5), RING_CFG, ["sync.algorithm=gossip_ma", "sync.p=2", "sync.q=2"])
    topo = cluster.topology
    assert isinstance(topo, RingTopology) and (topo.n, topo.p, topo.q) == (5, 2, 2)
    for plan, pre, post in gossip_rounds(cluster, 6):
        assert all(len(r) == 2 for r in plan.recv_from)
        assert_line_8(plan, pre, post)
        assert not all_equal(post)


@pytest.mark.parametrize("n,p", [(4, 1), (7, 2)])
def test_paired_gossip_averages_partners_and_preserves_the_mean(n, p):
    """sync.mixing=pair: both ends of a matched pair take (theta_a + theta_b) / 2, an unmatched node
    keeps its own, so the mean over the replicas is the same before and after a gossip-MA round."""
    cluster = SimulatedCluster(make_models(n), RING_CFG, ["sync.algorithm=gossip_ma", "sync.mixing=pair", f"sync.p={p}"])
    assert cluster.topology.mixing == "pair" and cluster.topology.q == 1
    for plan, pre, post in gossip_rounds(cluster, 8):
        assert_line_8(plan, pre, post)
        torch.testing.assert_close(torch.stack(post).mean(0), torch.stack(pre).mean(0), atol=1e-6, rtol=1e-6)


def test_pulled_gossip_does_not_preserve_the_mean():
    """The paper's one-way pull (q = 1 of 2p = 2): a round's mixing matrix is not column-stochastic."""
    cfg = {"components": [{"name": "all"}], "period": 1}
    cluster = SimulatedCluster(make_models(5), cfg, ["sync.algorithm=gossip_ma", "sync.p=1", "sync.q=1",
                                                     "sync.broadcast_initial=false"])
    pre = comp_values(cluster, "all")
    moved = False
    for t in range(1, 5):
        cluster.step()
        moved |= not torch.allclose(torch.stack(comp_values(cluster, "all")).mean(0), torch.stack(pre).mean(0))
    assert moved


@pytest.mark.parametrize("kind", ["ma", "bmuf"])
def test_gossip_with_q_2p_equals_local(kind):
    kw = dict(n=5, steps=17, config=TOY_CFG, finalize=False)
    step = lambda m, o, k, t: toy.train_step(m, o, 0, k, t)  # noqa: E731
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.05)  # noqa: E731
    loc = simulate(toy.ToyModel, sgd, step, overrides=[f"sync.algorithm=local_{kind}", "sync.p=2"], **kw)
    gos = simulate(toy.ToyModel, sgd, step, overrides=[f"sync.algorithm=gossip_{kind}", "sync.p=2", "sync.q=4"], **kw)
    assert loc.topology.q == gos.topology.q == 4
    for a, b in zip(loc.models, gos.models):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            assert torch.equal(x, y), name
    # sanity: a real gossip draw (q < 2p) gives a different result
    gos2 = simulate(toy.ToyModel, sgd, step, overrides=[f"sync.algorithm=gossip_{kind}", "sync.p=2", "sync.q=2"], **kw)
    assert not torch.equal(gos2.models[0].hidden.weight, loc.models[0].hidden.weight)


# -- start and end -------------------------------------------------------------------------------
def test_finalize_is_the_mean_of_all_replicas():
    n = 4
    cluster = simulate(toy.ToyModel, lambda m: torch.optim.SGD(m.parameters(), lr=0.05),
                       lambda m, o, k, t: toy.train_step(m, o, 0, k, t), n, 11, TOY_CFG,
                       ["sync.algorithm=gossip_bmuf"], finalize=False)
    before = [state(m) for m in cluster.models]
    assert not torch.equal(before[0]["hidden.weight"], before[1]["hidden.weight"])
    cluster.finalize()
    for name in before[0]:
        if name.endswith("num_batches_tracked"):
            continue
        mean = torch.stack([b[name] for b in before]).mean(0)
        for m in cluster.models:
            torch.testing.assert_close(m.state_dict()[name], mean, atol=1e-6, rtol=1e-6, msg=name)
        assert all_equal([m.state_dict()[name] for m in cluster.models]), name


def test_broadcast_initial_copies_replica_0():
    models = make_models(3)
    w0 = state(models[0])
    assert not torch.equal(w0["hidden.weight"], models[1].hidden.weight)
    SimulatedCluster(models, TOY_CFG, ["sync.algorithm=gossip_bmuf"])
    for m in models:
        for name, v in m.state_dict().items():
            assert torch.equal(v, w0[name]), name


def test_without_broadcast_initial_replicas_keep_their_weights():
    models = make_models(3)
    w = [state(m) for m in models]
    SimulatedCluster(models, TOY_CFG, ["sync.algorithm=ma", "sync.broadcast_initial=false"])
    for m, s in zip(models, w):
        for name, v in m.state_dict().items():
            assert torch.equal(v, s[name]), name


def test_bmuf_slots_start_from_the_broadcast_model():
    models = make_models(3)
    cluster = SimulatedCluster(models, TOY_CFG, ["sync.algorithm=bmuf"])
    for k in range(3):
        for c in cluster.comps[k]:
            assert torch.equal(cluster.slots[k][c.name].omega, cluster.comps[0][c.index].gather())
            assert torch.equal(cluster.slots[k][c.name].delta, torch.zeros(c.numel))


def test_two_workers_cannot_form_a_gossip_ring():
    # default p = 1 for n = 2, and 2p >= n: an impossible ring
    with pytest.raises(TopologyError, match=r"n=2"):
        SimulatedCluster(make_models(2), TOY_CFG, ["sync.algorithm=gossip_ma"])


def test_single_worker_gossip_is_plain_local_training():
    # like the Synchronizer at world size 1: nothing to synchronize (no ring is built)
    model = toy.ToyModel()
    cluster = SimulatedCluster([model], TOY_CFG, ["sync.algorithm=gossip_bmuf"])
    assert cluster.topology is None
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for t in range(1, 9):
        toy.train_step(model, opt, 0, 0, t)
        before = state(model)
        cluster.step()
        for name, v in model.state_dict().items():
            assert torch.equal(v, before[name])
    before = state(model)
    cluster.finalize()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_disabled_sync_does_nothing():
    cluster = SimulatedCluster(make_models(3), TOY_CFG, ["sync.algorithm=ma", "sync.enabled=false"])
    opts = opts_for(cluster.models)
    for t in range(1, 5):
        local_steps(cluster, opts, t)
        cluster.step()
    assert not all_equal([m.hidden.weight.detach().clone() for m in cluster.models])


# -- training works --------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ALGORITHMS)
def test_short_training_lowers_heldout_loss(algo):
    # Adam keeps the 64 local steps short; for the BMUF variants C = 2 in zeta*n*(1-eta) = C
    # gives eta = 0.5 on 4 workers (with the default C = 1, eta = 0.75 amplifies Adam's
    # fixed-size steps 4x and this tiny task diverges within 64 steps)
    # ASGD's server adds every worker's update (eq. 2 of 001): 4 workers x 4 Adam steps per round
    # diverge here (as ASGD does with long periods, Table 4 of 001); server_lr = 1/n averages them
    initial = toy.heldout_loss(toy.ToyModel())
    extra = ["sync.server_lr=0.25"] if algo == "asgd" else []
    cluster = simulate(toy.ToyModel, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
                       lambda m, o, k, t: toy.train_step(m, o, 0, k, t), 4, 64, TOY_CFG,
                       [f"sync.algorithm={algo}", "sync.momentum_rule_c=2.0", *extra])
    if cluster.cfg.uses_bmuf:
        assert cluster.block_momentum == pytest.approx(0.5)
    final = toy.heldout_loss(cluster.models[0])
    assert final < 0.9 * initial, (algo, initial, final)
    for m in cluster.models[1:]:  # finalize: one model
        assert torch.equal(m.hidden.weight, cluster.models[0].hidden.weight)
