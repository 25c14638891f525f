"""ASGD with a parameter server: eq. 2 of 001_3db6b3ddf1f13045.txt, staleness, bounded staleness (SSP).

The server role (:class:`gossip_accel.sync.engines.server.ParameterServer`) is tested in-process
(arrival order, staleness k, SSP waits and their release, leaving), then 4 spawned workers run
it over torch.distributed.rpc: no update is lost at the server, staleness stays within the
configured bound, the run trains and ends cleanly. Lock-step equality with the simulator is
the ``asgd_lockstep`` scenario of test_distributed_equals_simulator.py.
"""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.algorithms import (
    StalenessStats,
    asgd_delta,
    asgd_server_update,
    ssp_may_proceed,
    staleness_bound,
)
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.engines.server import ParameterServer
from gossip_accel.sync.simulate import SimulatedCluster

from harness import CONST, WORLD, async_results

TOY_CFG = {"components": toy.TOY_COMPONENTS, "period": 4}


def t(*v):
    return torch.tensor(v, dtype=torch.float32)


# -- eq. 2 and the bookkeeping --------------------------------------------------------------------
def test_eq2_by_hand():
    server = t(1.0, 1.0)
    pulled = server.clone()
    theta = pulled - 0.5 * t(2.0, -4.0)  # one SGD step with eta = 0.5, grad = [2, -4]
    delta = asgd_delta(theta, pulled)
    assert torch.equal(delta, t(-1.0, 2.0))
    asgd_server_update(server, delta)  # w~ <- w~ - eta grad
    assert torch.equal(server, t(0.0, 3.0))
    asgd_server_update(server, delta, server_lr=0.5)
    assert torch.equal(server, t(-0.5, 4.0))


def test_ssp_rule_and_bound():
    assert ssp_may_proceed(5, [5, 2, 3], None)
    assert ssp_may_proceed(4, [4, 2, 3], 2) and not ssp_may_proceed(5, [5, 2, 3], 2)
    assert ssp_may_proceed(2, [2, 2, 3], 0)  # the slowest worker always may
    assert ssp_may_proceed(7, [], 0)  # nobody else training
    assert staleness_bound(4, None) is None
    assert staleness_bound(4, 0) == 6 and staleness_bound(4, 2) == 18


def test_staleness_stats():
    s = StalenessStats()
    for k in (0, 3, 3, 1):
        s.add(k)
    assert (s.count, s.max, s.mean, s.histogram) == (4, 3, 1.75, {0: 1, 3: 2, 1: 1})
    s2 = StalenessStats()
    s2.load_state_dict(s.state_dict())
    assert s2 == s


def _server(n=3, rule="asgd", max_staleness=None, alpha=0.5):
    return ParameterServer(rule, {0: t(0.0, 0.0)}, {0: "all"}, n, alpha, 1.0, max_staleness, None, 0)


def test_server_applies_pushes_in_arrival_order_and_measures_staleness():
    ps = _server()
    r0, i0 = ps.push([0], [t(1.0, 0.0)], 0).wait()
    r1, i1 = ps.push([0], [t(0.0, 2.0)], 1).wait()
    r0b, i0b = ps.push([0], [t(1.0, 1.0)], 0).wait()
    assert torch.equal(r0[0], t(1.0, 0.0)) and torch.equal(r1[0], t(1.0, 2.0)) and torch.equal(r0b[0], t(2.0, 3.0))
    # k = server updates between the worker's pull and its push (eq. 2's k)
    assert (i0["staleness"], i1["staleness"], i0b["staleness"]) == (0, 1, 1)
    r2, i2 = ps.push([0], [t(0.0, 0.0)], 2).wait()
    assert i2["staleness"] == 3  # worker 2 pulled version 0, three pushes since
    assert ps.report()["applied"] == [2, 1, 1]


def test_server_easgd_rule_replies_the_old_centre():
    ps = _server(rule="easgd", alpha=0.5)
    reply, _ = ps.push([0], [t(4.0, -2.0)], 1).wait()
    assert torch.equal(reply[0], t(0.0, 0.0))  # w~ before the exchange (eq. 9 uses the same w~ twice)
    assert torch.equal(ps.centres[0], t(2.0, -1.0))  # w~ + 0.5 (w^1 - w~)


def test_ssp_holds_a_fast_worker_until_the_slowest_catches_up_or_leaves():
    ps = _server(n=3, max_staleness=1)
    assert ps.push([0], [t(1.0, 0.0)], 0).done()  # clock 1 vs min 0: gap 1 <= 1
    fut = ps.push([0], [t(1.0, 0.0)], 0)  # clock 2: two ahead of workers 1 and 2
    assert not fut.done()
    assert torch.equal(ps.centres[0], t(2.0, 0.0))  # the update itself is applied at once
    assert ps.push([0], [t(0.0, 1.0)], 1).done()
    assert not fut.done()  # worker 2 is still at clock 0
    ps.leave(2)  # a finished worker no longer holds anybody back
    assert fut.done()
    reply, info = fut.wait()
    assert torch.equal(reply[0], t(2.0, 1.0))  # ASGD pulls the newest model at release
    assert info["clock_gap"] <= 1
    assert ps.report()["staleness"]["waits"] == 1


def test_ssp_with_bound_zero_and_ties_does_not_deadlock():
    ps = _server(n=2, max_staleness=0)
    f0 = ps.push([0], [t(1.0, 0.0)], 0)
    assert not f0.done()  # one ahead of worker 1
    f1 = ps.push([0], [t(0.0, 1.0)], 1)
    assert f0.done() and f1.done()


def test_leave_with_a_final_push():
    ps = _server(n=2, max_staleness=0)
    fut = ps.push([0], [t(1.0, 0.0)], 0)
    assert not fut.done()
    assert ps.push([0], [t(0.0, 5.0)], 1, leave=True).done()  # worker 1's last steps, then it leaves
    assert fut.done()
    assert torch.equal(ps.centres[0], t(1.0, 5.0))
    assert ps.report()["training"] == [0]


def test_config():
    with pytest.raises(ConfigError, match="sync.max_staleness"):
        load_sync_config(None, ["sync.algorithm=asgd", "sync.max_staleness=-1"])
    with pytest.raises(ConfigError, match="sync.server_lr"):
        load_sync_config(None, ["sync.algorithm=asgd", "sync.server_lr=0"])
    cfg = load_sync_config(None, ["sync.algorithm=asgd"])
    assert cfg.is_async and cfg.uses_rpc and cfg.graph == "server"
    assert not load_sync_config(None, ["sync.algorithm=asgd", "sync.lockstep=true"]).uses_rpc


# -- the simulator: pushes in rank order ---------------------------------------------------------
def test_simulated_asgd_round_by_hand():
    models = [toy.ToyModel(seed=k) for k in range(2)]
    cluster = SimulatedCluster(models, TOY_CFG, ["sync.algorithm=asgd", "sync.period=1", "sync.components.0.period=1"])
    theta0 = float(models[0].out.bias.detach())
    with torch.no_grad():
        models[0].out.bias.add_(1.0)
        models[1].out.bias.add_(10.0)
    cluster.step()
    # worker 0 pushes +1 and pulls theta0 + 1; worker 1 pushes +10 and pulls theta0 + 11
    assert float(models[0].out.bias.detach()) == pytest.approx(theta0 + 1.0)
    assert float(models[1].out.bias.detach()) == pytest.approx(theta0 + 11.0)
    with torch.no_grad():
        models[0].out.bias.add_(0.5)  # a local step not yet pushed
    cluster.finalize()  # the final push, then everyone <- the server's model
    assert float(models[1].out.bias.detach()) == pytest.approx(theta0 + 11.5)


# -- ASGD over RPC (4 spawned workers, once per session) ---------------------------------------------
@pytest.fixture(scope="module")
def res():
    return async_results()


@pytest.mark.parametrize("name", ["asgd_const", "asgd_ssp", "resume_asgd_const"])
def test_no_update_is_lost_at_the_server(res, name):
    # every worker adds (rank + 1) * CONST per step; whatever the interleaving, the server's final
    # model is theta_0 + the sum of all of them (the last push at finalize included)
    steps = res[0][name]["steps"]
    total = sum((k + 1) * CONST * steps for k in range(WORLD))
    for r in range(WORLD):
        for key, theta0 in res[0][name]["initial"].items():
            if key.startswith("norm.running") or key.endswith("num_batches_tracked"):
                continue
            torch.testing.assert_close(res[r][name]["final"][key], theta0 + total, atol=1e-5, rtol=0)
    server = res[0][name]["report_final"]["server"]
    pushes = [res[r][name]["report_final"]["pushes"] for r in range(WORLD)]
    expected = sum(1 for t in range(1, steps + 1) if t % 2 == 0 or t % 3 == 0) if name == "asgd_const" else steps
    assert pushes == [expected] * WORLD  # one push per sync step (a resumed run restores the count)
    assert server["applied"] == [p + 1 for p in pushes]  # + the final push
    assert server["version"] == sum(server["applied"])
    assert server["training"] == [] and server["waiting"] == 0  # everybody left: a clean end


def test_staleness_is_measured_and_bounded_as_configured(res):
    name = "asgd_ssp"  # sync.max_staleness=1, rank 3 sleeps every step
    server = res[0][name]["report_final"]["server"]["staleness"]
    assert server["count"] == sum(server["histogram"].values()) > 0
    assert server["max_clock_gap"] <= 1
    assert server["max"] <= staleness_bound(WORLD, 1)
    for r in range(WORLD):
        st = res[r][name]["report_final"]["staleness"]
        assert st["count"] == res[r][name]["report_final"]["pushes"]
        assert st["max"] <= staleness_bound(WORLD, 1) and st["max_clock_gap"] <= 1
        m = res[r][name]["metrics"]
        assert m["sync/staleness_max"] == st["max"]
    assert res[0][name]["metrics"]["sync/server/clock_gap_max"] <= 1


def test_ssp_stops_the_others_exactly_at_the_bound(res):
    # worker 3 is held before its first step; with max_staleness = 2 the other three must stop
    # with their 3rd pull held back (clock 3 = 0 + 2 + 1) until worker 3 moves
    probe = res[3]["hold_asgd_ssp"]["probe"]
    assert probe["clock"] == [3, 3, 3, 0]
    assert probe["waiting"] == 3
    final = res[0]["hold_asgd_ssp"]["report_final"]["server"]
    assert final["staleness"]["max_clock_gap"] <= 2 and final["training"] == []


def test_asgd_trains(res):
    r0 = res[0]["asgd_train"]
    assert r0["heldout"] < 0.9 * r0["heldout_initial"]
    for r in range(1, WORLD):
        assert res[r]["asgd_train"]["heldout"] == pytest.approx(r0["heldout"])  # one final model


def test_asgd_bytes_are_counted(res):
    m1 = res[1]["asgd_train"]["metrics"]
    nbytes = sum(v.numel() * 4 for k, v in res[1]["asgd_train"]["initial"].items()
                 if not (k.startswith("norm.running") or k.endswith("num_batches_tracked")))
    # a worker sends its update and receives the model at every push (period 1)
    assert m1["sync/bytes_sent"] == pytest.approx(res[1]["asgd_train"]["steps"] * nbytes)
    assert m1["sync/bytes_recv"] == pytest.approx(res[1]["asgd_train"]["steps"] * nbytes)
    # the server's rank also counts what it receives from and sends to the others
    assert res[0]["asgd_train"]["metrics"]["sync/bytes_recv"] > 0
