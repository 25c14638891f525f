"""EASGD: eq. 8 (synchronous) and eq. 9 (asynchronous) of 001_3db6b3ddf1f13045.txt, alpha = eta * lambda.

By-hand checks of the pure rules, the simulator oracle, and the asynchronous run over RPC
(conservation of sum_i w^i + w~, convergence, a straggler on the server's rank). The
deterministic multi-process equality (sync EASGD, lock-step async EASGD) is in
test_distributed_equals_simulator.py (scenarios ``easgd``, ``easgd_async_lockstep``).
"""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.algorithms import elastic_center_update_sync, elastic_exchange, elastic_worker_update
from gossip_accel.sync.config import ConfigError, load_sync_config, validate_for_world
from gossip_accel.sync.simulate import SimulatedCluster

from harness import CONST, WORLD, async_results

TOY_CFG = {"components": toy.TOY_COMPONENTS, "period": 4}


def t(*v):
    return torch.tensor(v, dtype=torch.float32)


# -- the rules ---------------------------------------------------------------------------------
def test_eq8_by_hand_two_workers():
    # alpha = 0.25, w~ = [0, 4], w^1 = [1, 0], w^2 = [3, 8]
    centre, w1, w2 = t(0.0, 4.0), t(1.0, 0.0), t(3.0, 8.0)
    total = w1 + w2
    elastic_worker_update(w1, centre, 0.25)  # w1 - 0.25 (w1 - c) = [0.75, 1]
    elastic_worker_update(w2, centre, 0.25)  # [2.25, 7]
    elastic_center_update_sync(centre, total, 2, 0.25)  # c + 0.25 ((1-0) + (3-0), (0-4) + (8-4)) = [1, 4]
    assert torch.equal(w1, t(0.75, 1.0))
    assert torch.equal(w2, t(2.25, 7.0))
    assert torch.equal(centre, t(1.0, 4.0))


def test_eq9_exchange_conserves_the_sum():
    g = torch.Generator().manual_seed(0)
    theta, centre = torch.randn(6, generator=g), torch.randn(6, generator=g)
    before = theta + centre
    d = theta - centre
    expected_theta, expected_centre = theta - 0.3 * d, centre + 0.3 * d
    elastic_exchange(theta, centre, 0.3)
    torch.testing.assert_close(theta, expected_theta)
    torch.testing.assert_close(centre, expected_centre)
    torch.testing.assert_close(theta + centre, before)


def test_eq8_with_beta_one_puts_the_centre_at_the_mean():
    ws = [t(1.0, 2.0), t(3.0, -2.0), t(5.0, 0.0), t(-1.0, 4.0)]
    centre = t(10.0, 10.0)
    elastic_center_update_sync(centre, torch.stack(ws).sum(0), 4, 0.25)  # beta = n alpha = 1
    torch.testing.assert_close(centre, torch.stack(ws).mean(0))


# -- alpha = eta * lambda ----------------------------------------------------------------------
def test_alpha_resolution():
    assert load_sync_config(None, ["sync.algorithm=easgd"]).resolved_alpha(4) == pytest.approx(0.225)  # 0.9/n
    cfg = load_sync_config(None, ["sync.algorithm=easgd", "sync.easgd_lambda=2.0", "sync.easgd_eta=0.05"])
    assert cfg.resolved_alpha(8) == pytest.approx(0.1)
    assert load_sync_config(None, ["sync.easgd_alpha=0.3"]).resolved_alpha(16) == pytest.approx(0.3)


@pytest.mark.parametrize("overrides, key", [
    (["sync.easgd_alpha=0.3", "sync.easgd_lambda=1.0", "sync.easgd_eta=0.1"], "sync.easgd_alpha"),
    (["sync.easgd_lambda=1.0"], "sync.easgd_eta"),
    (["sync.easgd_eta=0.1"], "sync.easgd_lambda"),
    (["sync.easgd_alpha=1.5"], "sync.easgd_alpha"),
    (["sync.easgd_alpha=0"], "sync.easgd_alpha"),
    (["sync.algorithm=easgd", "sync.warmup_steps=4"], "sync.warmup_steps"),
])
def test_bad_easgd_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_sync_config(None, overrides)
    assert key in str(e.value)


def test_synchronous_easgd_refuses_a_divergent_beta():
    cfg = load_sync_config(None, ["sync.algorithm=easgd", "sync.easgd_alpha=0.5"])
    validate_for_world(cfg, 3)  # beta = 1.5
    with pytest.raises(ConfigError, match="beta"):
        validate_for_world(cfg, 4)  # beta = 2
    with pytest.raises(ConfigError, match="server_rank"):
        validate_for_world(load_sync_config(None, ["sync.algorithm=easgd", "sync.server_rank=4"]), 4)


# -- the simulator -----------------------------------------------------------------------------
def _models(n):
    return [toy.ToyModel(seed=k) for k in range(n)]


def _flat(m):
    return torch.cat([p.detach().reshape(-1).clone() for p in m.parameters()])


def test_simulated_sync_easgd_is_eq8_per_component():
    cluster = SimulatedCluster(_models(3), TOY_CFG, ["sync.algorithm=easgd", "sync.easgd_alpha=0.2",
                                                     "sync.buffers=local"])
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in cluster.models]
    rest = [c.name for c in cluster.comps[0]].index("rest")
    centre = cluster.centre[rest].clone()
    for step in range(1, 5):
        for k, (m, o) in enumerate(zip(cluster.models, opts)):
            toy.train_step(m, o, 0, k, step)
        ws = [cluster.comps[k][rest].gather().clone() for k in range(3)]
        cluster.step()
    # step 4: the "rest" component (period 4) took eq. 8 with the models after the local step
    expected = [w - 0.2 * (w - centre) for w in ws]
    new_centre = centre + 0.2 * sum(w - centre for w in ws)
    for k in range(3):
        torch.testing.assert_close(cluster.comps[k][rest].gather(), expected[k])
    torch.testing.assert_close(cluster.centre[rest], new_centre)


def test_simulated_async_easgd_is_eq9_in_rank_order():
    cluster = SimulatedCluster(_models(2), TOY_CFG, ["sync.algorithm=easgd_async", "sync.easgd_alpha=0.5",
                                                     "sync.period=1", "sync.components.0.period=1"])
    with torch.no_grad():
        cluster.models[1].out.bias.add_(4.0)  # w^1 - w~ = 4 on this parameter, w^0 - w~ = 0
    c0 = float(cluster.models[0].out.bias.detach())
    cluster.step()
    # worker 0 first: nothing moves; worker 1: w^1 <- w^1 - 0.5 * 4, w~ <- w~ + 0.5 * 4
    assert float(cluster.models[0].out.bias.detach()) == pytest.approx(c0)
    assert float(cluster.models[1].out.bias.detach()) == pytest.approx(c0 + 2.0)
    rest = [c.name for c in cluster.comps[0]].index("rest")
    assert float(cluster.centre[rest][-1]) == pytest.approx(c0 + 2.0)
    cluster.finalize()  # every replica <- the centre variable
    assert torch.equal(_flat(cluster.models[0]), _flat(cluster.models[1]))


# -- asynchronous EASGD over RPC (4 spawned workers, once per session) ---------------------------
@pytest.fixture(scope="module")
def res():
    return async_results()


def test_async_easgd_conserves_workers_plus_centre(res):
    # eq. 9 moves w^i and w~ by opposite amounts: sum_i w^i + w~ only changes by the local steps
    name = "easgd_async_const"
    steps = res[0][name]["steps"]
    local = sum((k + 1) * CONST * steps for k in range(WORLD))
    for key in ("hidden.weight", "embedding.weight", "out.bias"):
        theta0 = res[0][name]["initial"][key]
        centre = res[0][name]["final"][key]  # finalize broadcasts the centre variable
        total = sum(res[r][name]["before"][key] for r in range(WORLD)) + centre
        torch.testing.assert_close(total, (WORLD + 1) * theta0 + local, atol=1e-5, rtol=0)


def test_async_easgd_every_exchange_reaches_the_server_and_ends_cleanly(res):
    server = res[0]["easgd_async_const"]["report_final"]["server"]
    pushes = [res[r]["easgd_async_const"]["report_final"]["pushes"] for r in range(WORLD)]
    assert server["applied"] == pushes
    assert server["training"] == [] and server["waiting"] == 0
    for r in range(1, WORLD):
        for k, v in res[r]["easgd_async_const"]["final"].items():
            assert torch.equal(v, res[0]["easgd_async_const"]["final"][k]), k


def test_async_easgd_trains(res):
    r0 = res[0]["easgd_async_train"]
    assert r0["heldout"] < 0.9 * r0["heldout_initial"]
    m = r0["metrics"]
    assert m["sync/server/pushes"] == sum(res[r]["easgd_async_train"]["report_final"]["pushes"] for r in range(WORLD))
    assert m["sync/bytes_recv"] > 0  # the server's traffic is counted on its rank
