"""sync.warmup_kind: average (full averages every P steps), gradients (DDP for W steps), ramp (the period
doubles from P up to H_i): the schedule, the config errors, the simulator, and a DDP model under
AccelerateSynchronizer against the simulator (tests/group_runs.py). The plain-model path (the optimizer
pre-hook) and resume are in tests/test_distributed_equals_simulator.py (gossip_bmuf_warmup_grads)."""
from __future__ import annotations

import pytest
import torch

import group_runs
from gossip_accel.sync import toy
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.schedule import event_at, needs_gradient_allreduce
from gossip_accel.sync.simulate import SimulatedCluster, simulate
from harness import BASE, DATA_SEED, assert_matches_oracle, initial_model, make_optimizer


def events(period: int, w: int, p: int, kind: str, until: int) -> list[tuple[int, str, int]]:
    return [(t, e.kind, e.round) for t in range(1, until + 1) if (e := event_at(t, period, w, p, warmup_kind=kind)) is not None]


def test_average_is_the_old_schedule():
    assert events(16, 32, 8, "average", 64) == [(8, "warmup", 0), (16, "warmup", 0), (24, "warmup", 0),
                                                 (32, "warmup_end", 0), (48, "sync", 1), (64, "sync", 2)]
    assert events(4, 0, 1, "average", 12) == [(4, "sync", 1), (8, "sync", 2), (12, "sync", 3)]


def test_gradients_warmup_averages_no_model_and_restarts_at_w():
    assert events(16, 32, 8, "gradients", 64) == [(32, "restart", 0), (48, "sync", 1), (64, "sync", 2)]
    assert [t for t in range(1, 40) if needs_gradient_allreduce(t, 32, "gradients")] == list(range(1, 33))
    assert not needs_gradient_allreduce(1, 32, "average") and not needs_gradient_allreduce(1, 32, "ramp")


def test_ramp_doubles_the_period_from_p_up_to_h():
    # W = 16, P = 8: the warm-up averages at 8 and 16, then intervals 8, 16, 32, 64, 128, 128, ...
    ramp = events(128, 16, 8, "ramp", 400)
    assert ramp[:2] == [(8, "warmup", 0), (16, "warmup_end", 0)]
    assert [(t, r) for t, _, r in ramp[2:]] == [(24, 1), (40, 2), (72, 3), (136, 4), (264, 5), (392, 6)]
    # H = 16: 8, then 16 forever; P >= H: the plain schedule
    assert [t for t, k, _ in events(16, 16, 8, "ramp", 80) if k == "sync"] == [24, 40, 56, 72]
    assert events(4, 8, 8, "ramp", 20) == events(4, 8, 8, "average", 20)


@pytest.mark.parametrize("overrides, words", [
    (["sync.warmup_kind=ddp"], "sync.warmup_kind='ddp'; choose one of average, gradients, ramp"),
    (["sync.warmup_kind=gradients", "sync.hierarchy.group_size=2"], "not implemented with sync.hierarchy"),
])
def test_bad_warmup_kind_is_a_one_line_error(overrides, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        load_sync_config(None, overrides)


def _gradient_warmup_cluster(w: int, n: int = 4):
    models = [initial_model(k) for k in range(n)]
    opts = [make_optimizer(m) for m in models]
    cluster = SimulatedCluster(models, BASE, ["sync.algorithm=bmuf", f"sync.warmup_steps={w}",
                                              "sync.warmup_kind=gradients"], optimizers=opts)
    return models, opts, cluster


def _step(models, opts, cluster, t: int) -> None:
    for k, (m, o) in enumerate(zip(models, opts)):
        o.zero_grad(set_to_none=True)
        toy.backward(m, DATA_SEED, k, t)
    cluster.allreduce_gradients()
    for o in opts:
        o.step()
    cluster.step()


def test_simulated_gradient_warmup_keeps_replicas_equal_then_restarts_the_slots():
    models, opts, cluster = _gradient_warmup_cluster(w=5)
    for t in range(1, 6):
        _step(models, opts, cluster, t)
        for m in models[1:]:  # DDP: the same step from the same model (BatchNorm statistics are per replica)
            for (name, a), b in zip(models[0].named_parameters(), m.parameters()):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=f"step {t} {name}")
    for k in range(4):  # restart at W: omega <- theta_W, Delta <- 0
        for comp in cluster.comps[k]:
            slots = cluster.slots[k][comp.name]
            torch.testing.assert_close(slots.omega, comp.gather())
            assert not slots.delta.any()
    _step(models, opts, cluster, 6)  # local steps again: the replicas part
    w = [m.hidden.weight for m in models]
    assert any((w[0] - x).abs().max() > 1e-4 for x in w[1:])


def test_simulate_refuses_a_gradient_warmup_it_cannot_run():
    with pytest.raises(ConfigError, match="allreduce_gradients"):
        simulate(toy.ToyModel, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), lambda *a: 0.0, 2, 3,
                 BASE, ["sync.warmup_steps=2", "sync.warmup_kind=gradients"])


def test_ddp_hook_warmup_equals_simulator():
    name = "ddp_gossip_bmuf_warmup_grads"
    got = group_runs.run(name)
    before, final = group_runs.simulate(name)
    for rank, r in enumerate(got):
        assert_matches_oracle(r, before[rank], final[rank], f"{name} rank {rank} ")
    # bytes: DDP's ring all-reduce of the fp32 gradients for the 6 warm-up steps, counted as `gradients`
    n_params = sum(v.numel() for k, v in got[0]["final"].items() if "running" not in k and "num_batches" not in k)
    assert got[0]["metrics"]["sync/bytes_sent/gradients"] == pytest.approx(6 * 2 * 3 / 4 * n_params * 4)
