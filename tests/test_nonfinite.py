"""A diverged worker (NaN/inf) is detected at sync time, excluded and reset (sync.nonfinite, health.py).

The distributed part spawns 4 real gloo workers ONCE for every scenario; rank 2 (or every rank)
injects a NaN into its weights, its loss (so the optimizer step makes the weights NaN) or its
BMUF slots between two syncs. Each scenario is replayed by the simulator with the same injection:
both must end with the same (finite) parameters, the same resets and the same errors.
"""
from __future__ import annotations

import os
import re
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist

from gossip_accel import Synchronizer, shutdown
from gossip_accel.sync import health, toy
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.simulate import SimulatedCluster
from harness import BASE, DATA_SEED, WORLD, initial_model, make_optimizer, model_state, spawn_with_timeout

ATOL = 1e-5
SICK = 2  # the rank that diverges
INJECT_AT = 6  # between the syncs at steps 4 and 8 (rest: period 4, embedding: period 8)
STEPS = 14

# name -> (overrides, what is injected, which ranks)
SCENARIOS: dict[str, tuple[list[str], str, tuple[int, ...]]] = {
    "ma_weights": (["sync.algorithm=ma"], "weights", (SICK,)),
    "bmuf_weights": (["sync.algorithm=bmuf", "sync.block_momentum=0.9"], "weights", (SICK,)),
    "gossip_bmuf_weights": (["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.block_momentum=0.9"],
                            "weights", (SICK,)),
    "local_bmuf_weights": (["sync.algorithm=local_bmuf", "sync.p=1", "sync.block_momentum=0.9"], "weights", (SICK,)),
    "ma_loss": (["sync.algorithm=ma"], "loss", (SICK,)),
    "gossip_bmuf_loss": (["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1"], "loss", (SICK,)),
    "bmuf_slots": (["sync.algorithm=bmuf", "sync.block_momentum=0.9"], "slots", (SICK,)),
    "gossip_bmuf_slots_cpu": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.slots_on_cpu=true"], "slots", (SICK,)),
    # with H2's low-precision wire (sync.exchange_dtype): the sick rank sends zeros in bf16 as well
    "bmuf_bf16_wire_weights": (["sync.algorithm=bmuf", "sync.exchange_dtype=bfloat16"], "weights", (SICK,)),
    # the int8/int4 wire: the sick rank sends a zero outer gradient; ring: both ends of its edges restart the copies
    "bmuf_int8_wire_weights": (["sync.algorithm=bmuf", "sync.exchange_dtype=int8"], "weights", (SICK,)),
    "gossip_bmuf_int4_wire_weights": (["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=int4"],
                                      "weights", (SICK,)),
    "ma_broadcast_buffers": (["sync.algorithm=ma", "sync.buffers=broadcast"], "weights", (0,)),
    # issue 17: an overlapped sync (posted at 8, applied at 10) resets the sick rank at the apply step
    "bmuf_overlap_weights": (["sync.algorithm=bmuf", "sync.block_momentum=0.9", "sync.overlap_steps=2"], "weights",
                             (SICK,)),
    # (not staggered: a NaN loss spoils every component, which must all be reset at the same step to stay clean)
    "gossip_bmuf_overlap_loss": (["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.overlap_steps=2"],
                                 "loss", (SICK,)),
    # the parameter-server algorithms and ADPSGD (deterministic lock-step modes)
    "easgd": (["sync.algorithm=easgd", "sync.easgd_alpha=0.2"], "weights", (SICK,)),
    "easgd_async_lockstep": (["sync.algorithm=easgd_async", "sync.lockstep=true", "sync.easgd_alpha=0.3"],
                             "loss", (SICK,)),
    "asgd_lockstep_sick_server": (["sync.algorithm=asgd", "sync.lockstep=true", "sync.server_lr=0.25",
                                   "sync.server_rank=2"], "weights", (SICK,)),
    "adpsgd_fixed_lockstep": (["sync.algorithm=adpsgd_fixed", "sync.lockstep=true"], "weights", (SICK,)),
    "adpsgd_delay_lockstep": (["sync.algorithm=adpsgd_delay", "sync.lockstep=true"], "loss", (SICK,)),
    # truly asynchronous over RPC: not deterministic, checked for invariants only (RPC below)
    "asgd_rpc": (["sync.algorithm=asgd"], "weights", (SICK,)),
    "adpsgd_fixed_rpc_sick_passive": (["sync.algorithm=adpsgd_fixed"], "weights", (3,)),
    "ma_raise": (["sync.algorithm=ma", "sync.nonfinite=raise"], "weights", (SICK,)),
    "bmuf_all_sick": (["sync.algorithm=bmuf"], "weights", tuple(range(WORLD))),
}
RPC = ("asgd_rpc", "adpsgd_fixed_rpc_sick_passive")
ERRORS = {"ma_raise": r"rank\(s\) \[2\] have a non-finite", "bmuf_all_sick": "every worker"}


def local_step(model, opt, rank: int, t: int, inject: str, sick: bool) -> None:
    """toy.train_step, with the injection of the scenario on a sick rank at step INJECT_AT."""
    hit = sick and t == INJECT_AT
    if hit and inject == "loss":
        opt.zero_grad(set_to_none=True)
        ids, y = toy.batch(DATA_SEED, rank, t)
        (torch.nn.functional.mse_loss(model(ids), y) * float("nan")).backward()
        opt.step()
        return
    toy.train_step(model, opt, DATA_SEED, rank, t)
    if hit and inject == "weights":
        with torch.no_grad():
            model.hidden.weight[0, 0] = float("nan")


def inject_slots(slots: dict, inject: str, sick: bool, t: int) -> None:
    if sick and t == INJECT_AT and inject == "slots":
        slots["rest"].delta[3] = float("inf")


def run_scenario(rank: int, name: str) -> dict:
    overrides, inject, sick_ranks = SCENARIOS[name]
    model = initial_model(rank)
    opt = make_optimizer(model)
    sync = Synchronizer(model, BASE, overrides)
    sync.on_reset = lambda names: health.clear_optimizer_state(opt, model, names)
    out: dict = {"error": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for t in range(1, STEPS + 1):
                local_step(model, opt, rank, t, inject, rank in sick_ranks)
                inject_slots(sync.slots, inject, rank in sick_ranks, t)
                sync.step()
            out["before"] = model_state(model)
            sync.finalize()
            out["final"] = model_state(model)
        except health.NonFiniteError as e:
            out["error"] = str(e)
            sync.close()  # an RPC session ends here; the lock-step errors are raised on every rank alike
    out["warnings"] = [str(w.message) for w in caught if "was non-finite" in str(w.message)]
    out["events"] = list(sync.reset_events)
    out["metrics"] = sync.metrics()
    return out


def _worker(rank: int, world: int, init_file: str, outdir: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {name: run_scenario(rank, name) for name in SCENARIOS}
    torch.save(results, os.path.join(outdir, f"nonfinite{rank}.pt"))
    shutdown()


def simulate(name: str) -> dict:
    """The oracle of run_scenario: the same injection, the same optimizer-state clearing."""
    overrides, inject, sick_ranks = SCENARIOS[name]
    models = [initial_model(k) for k in range(WORLD)]
    opts = [make_optimizer(m) for m in models]
    cluster = SimulatedCluster(models, BASE, overrides)
    cluster.on_reset = lambda k, names: health.clear_optimizer_state(opts[k], models[k], names)
    out: dict = {"error": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for t in range(1, STEPS + 1):
                for k in range(WORLD):
                    local_step(models[k], opts[k], k, t, inject, k in sick_ranks)
                    inject_slots(cluster.slots[k], inject, k in sick_ranks, t)
                cluster.step()
            out["before"] = [model_state(m) for m in models]
            cluster.finalize()
            out["final"] = [model_state(m) for m in models]
        except health.NonFiniteError as e:
            out["error"] = str(e)
    out["warnings"] = [str(w.message) for w in caught if "was non-finite" in str(w.message)]
    out["events"] = list(cluster.reset_events)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("nonfinite"))
    init_file = tempfile.mktemp(prefix="gloo_init_", dir=outdir)
    spawn_with_timeout(_worker, (WORLD, init_file, outdir), WORLD, timeout=300)
    with torch.serialization.safe_globals([health.ResetEvent]):  # our own dataclass, allow-listed by name
        return [torch.load(os.path.join(outdir, f"nonfinite{r}.pt"), weights_only=True) for r in range(WORLD)]


def assert_close_states(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], atol=ATOL, rtol=1e-5, msg=lambda m: f"{what} {k}: {m}")


RECOVERING = [n for n in SCENARIOS if n not in ERRORS and n not in RPC]


@pytest.mark.parametrize("name", RECOVERING)
def test_diverged_worker_is_reset_and_training_continues(results, name):
    _, inject, sick_ranks = SCENARIOS[name]
    sim = simulate(name)
    assert sim["error"] is None
    for rank in range(WORLD):
        got = results[rank][name]
        assert got["error"] is None, got["error"]
        for what in ("before", "final"):  # every parameter and buffer finite, and equal to the oracle
            for k, v in got[what].items():
                assert torch.isfinite(v.float()).all(), f"{name} rank {rank} {what} {k} not finite"
            assert_close_states(got[what], sim[what][rank], f"{name} rank {rank} {what}")
        mine = got["events"]
        assert mine == [e for e in sim["events"] if e.rank == rank], f"{name} rank {rank} resets differ"
        if rank in sick_ranks:
            assert mine and all(e.rank == rank for e in mine)
            assert got["metrics"]["sync/nonfinite_resets"] == len(mine)
            assert got["warnings"] and all(f"rank {rank} step" in w for w in got["warnings"])
            if inject != "slots":  # weights/loss: the first sync after the injection resets the component
                applied = 8 + load_sync_config(BASE, SCENARIOS[name][0]).overlap_steps  # overlapped: at 8 + tau
                assert any(e.step == applied and e.component == "rest" and "hidden.weight" in e.params for e in mine)
        else:
            assert not mine and not got["warnings"], f"{name}: rank {rank} was reset but never diverged"
    for rank in range(1, WORLD):  # Algorithm 1 line 20: every replica ends equal
        assert_close_states(results[rank][name]["final"], results[0][name]["final"], f"{name} final rank {rank}")


@pytest.mark.parametrize("name", RPC)
def test_asynchronous_rpc_modes_recover(results, name):
    """ASGD over RPC: the server rejects the NaN push and the worker restarts from the reply. ADPSGD over
    RPC with a diverged passive: actives drop its copies; it resets from a finite model an active sent
    (at a later sync or at the end, whichever comes first: the timing is not deterministic)."""
    _, _, sick_ranks = SCENARIOS[name]
    for rank in range(WORLD):
        got = results[rank][name]
        assert got["error"] is None, got["error"]
        for k, v in got["final"].items():
            assert torch.isfinite(v.float()).all(), f"{name} rank {rank} final {k} not finite"
        if rank in sick_ranks:
            assert got["events"] and got["warnings"] and all(e.rank == rank for e in got["events"])
            assert any(e.component == "rest" and e.step >= 8 for e in got["events"])
        else:
            assert not got["events"]
    for rank in range(1, WORLD):
        assert_close_states(results[rank][name]["final"], results[0][name]["final"], f"{name} final rank {rank}")
    if name == "asgd_rpc":
        assert results[0][name]["metrics"]["sync/server/rejected_nonfinite"] >= 1


def test_gossip_receivers_drop_the_diverged_copy(results):
    dropped = [results[r]["gossip_bmuf_weights"]["metrics"]["sync/nonfinite_dropped"] for r in range(WORLD)]
    assert sum(dropped) > 0 and dropped[SICK] == 0  # the sick rank's neighbours dropped its copy
    # the flag all-reduce is only paid when something is all-reduced (buffers here), and counted apart
    m = results[0]["ma_weights"]["metrics"]
    # ONE flag all-reduce per round of (n, m) float32 flags, ring accounting 2 (n-1)/n * n*m*4 bytes:
    # steps 4, 12: rest + buffers (m=2); step 8: 2 embedding shards + rest + buffers (m=4);
    # finalize: the 3 components (m=3), then the buffers (m=1)
    per_flag = 2 * (WORLD - 1) / WORLD * WORLD * 4
    assert m["sync/nonfinite_flag_bytes_sent"] == pytest.approx(per_flag * (2 + 4 + 2 + 3 + 1))
    assert "sync/bytes_sent/nonfinite_flags" not in m


@pytest.mark.parametrize("name", list(ERRORS))
def test_policy_raise_and_all_sick_give_the_same_clear_error_everywhere(results, name):
    sim = simulate(name)
    assert sim["error"] is not None
    for rank in range(WORLD):
        err = results[rank][name]["error"]
        assert err is not None and re.search(ERRORS[name], err), err
        assert "at sync step 8" in err  # the first sync after the injection; names the component too
        assert err == sim["error"]


# -- the pure pieces (health.py) and the simulator alone ------------------------------------------
def test_neighbour_mean_drops_non_finite_terms():
    own, a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([float("nan"), 0.0])
    ok, dropped = health.neighbour_mean_(own, [a, b])
    assert ok and dropped == [1] and torch.equal(own, torch.tensor([2.0, 3.0]))
    sick = torch.tensor([float("inf"), 0.0])
    ok, dropped = health.neighbour_mean_(sick, [a, torch.tensor([5.0, 6.0])])
    assert not ok and dropped == [] and torch.equal(sick, torch.tensor([4.0, 5.0]))
    nothing = torch.tensor([float("nan")])
    ok, dropped = health.neighbour_mean_(nothing, [torch.tensor([float("nan")])])
    assert not ok and dropped == [0] and torch.isnan(nothing).all()
    # without the check it is exactly Algorithm 1 line 8: (theta_k + sum)/(q+1), NaN included
    own = torch.tensor([1.0])
    health.neighbour_mean_(own, [torch.tensor([float("nan")])], check=False)
    assert torch.isnan(own).all()


def test_masked_mean_and_verdict():
    xs = [torch.tensor([1.0]), torch.tensor([float("nan")]), torch.tensor([3.0])]
    assert torch.equal(health.masked_mean(xs, [False, True, False]), torch.tensor([2.0]))
    assert torch.equal(health.masked_mean(xs[::2], [False, False]), torch.stack(xs[::2]).mean(0))
    with pytest.raises(health.NonFiniteError, match="every one of the 2"):
        health.masked_mean(xs[:2], [True, True])
    # the (n, m) flags after an all-reduce mean: each rank filled its own row
    n = 3
    flags = sum(health.flag_matrix(s, r, n) for r, s in enumerate([[False, True], [False, False], [True, True]])) / n
    v = health.Verdict.from_flags(["a", "b"], flags, scale=n)
    assert v.sick_ranks(0) == [2] and v.sick_ranks(1) == [0, 2] and v.healthy(1) == 1
    v.check("reset", step=5)  # somebody healthy everywhere: no error
    with pytest.raises(health.NonFiniteError, match=r"rank\(s\) \[2\] .*'a' at sync step 5"):
        v.check("raise", step=5)
    all_sick = health.Verdict(["c"], [[True], [True]])
    with pytest.raises(health.NonFiniteError, match="every worker \\(2 ranks\\) .*'c'"):
        all_sick.check("reset", step=1)


def test_replica_sick_checks_the_bmuf_slots():
    from gossip_accel.sync.algorithms import BMUFSlots

    slots = BMUFSlots.start_from(torch.zeros(3))
    assert health.replica_sick(torch.zeros(3), slots) == (False, False)
    slots.omega[1] = float("nan")
    assert health.replica_sick(torch.zeros(3), slots) == (False, True)
    assert health.replica_sick(torch.tensor([float("-inf")]), None) == (True, False)


def test_ring_decision_errors_name_rank_step_and_component():
    assert health.ring_decision("reset", 1, 8, "rest", True, False, [0], [2]) is None  # a receiver just drops
    assert "1 finite neighbour" in health.ring_decision("reset", 2, 8, "rest", False, False, [], [3])
    with pytest.raises(health.NonFiniteError, match=r"rank 2: its component 'rest' at sync step 8 .* rank\(s\) \[3\]"):
        health.ring_decision("reset", 2, 8, "rest", False, False, [0], [3])
    with pytest.raises(health.NonFiniteError, match=r"rank\(s\) \[3\] .*'rest'.*seen on rank 1"):
        health.ring_decision("raise", 1, 8, "rest", True, False, [0], [3])


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_clear_optimizer_state_forgets_the_reset_parameters(kind):
    from gossip_accel.sync import SyncedOptimizer

    model = toy.ToyModel()
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if kind == "sgd"
           else torch.optim.Adam(model.parameters(), lr=0.1))
    toy.train_step(model, opt, 0, 0, 1)
    wrapped = SyncedOptimizer(opt, Synchronizer(model, BASE, ["sync.enabled=false"]))
    assert health.clear_optimizer_state(wrapped, model, ["hidden.weight", "embedding.weight", "nope"]) == 2
    assert model.hidden.weight not in opt.state and model.out.weight in opt.state
    toy.train_step(model, opt, 0, 0, 2)  # the optimizer starts its state again


def test_simulator_gossip_sick_rank_without_finite_neighbour_raises():
    models = [initial_model(k) for k in range(WORLD)]
    cluster = SimulatedCluster(models, BASE, ["sync.algorithm=gossip_ma", "sync.p=1", "sync.q=1", "sync.buffers=local"])
    plan = cluster.topology.plan(cluster.comps[0][-1].index, 1)  # 'rest' at its first sync (step 4)
    both = {SICK, *plan.recv_from[SICK]}
    for t in range(1, 4):
        cluster.step()
    with torch.no_grad():
        for k in both:
            models[k].hidden.weight[0, 0] = float("nan")
    with pytest.raises(health.NonFiniteError, match=f"rank {SICK}: its component 'rest' at sync step 4"):
        cluster.step()


def test_simulator_gossip_raise_policy():
    models = [initial_model(k) for k in range(WORLD)]
    cluster = SimulatedCluster(models, BASE, ["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.nonfinite=raise",
                                              "sync.buffers=local"])
    for t in range(1, 4):
        cluster.step()
    with torch.no_grad():
        models[SICK].hidden.weight[0, 0] = float("nan")
    with pytest.raises(health.NonFiniteError, match=rf"\[{SICK}\] hold a non-finite .*'rest'.*sync.nonfinite=raise"):
        cluster.step()


def test_ignore_policy_spreads_nan_as_before():
    models = [initial_model(k) for k in range(WORLD)]
    cluster = SimulatedCluster(models, BASE, ["sync.algorithm=ma", "sync.nonfinite=ignore"])
    with torch.no_grad():
        models[SICK].hidden.weight[0, 0] = float("nan")
    for t in range(1, 5):
        cluster.step()
    assert all(torch.isnan(m.hidden.weight).any() for m in models) and not cluster.reset_events


def test_config_key_is_validated():
    assert load_sync_config(None).nonfinite == "reset"
    with pytest.raises(ConfigError, match="sync.nonfinite='skip'; choose one of reset, raise, ignore"):
        load_sync_config(None, ["sync.nonfinite=skip"])


def test_distributed_run_clears_the_optimizer_state_of_a_reset_replica(tmp_path):
    """train.run.DistributedRun wires Synchronizer.on_reset to clear_optimizer_state (through Accelerate's wrapper)."""
    from gossip_accel.train.run import DistributedRun

    model = toy.ToyModel()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # world size 1: nothing to synchronize
        run = DistributedRun(model, opt, load_sync_config(BASE), tmp_path, cpu=True, checkpoint=False)
    toy.train_step(run.model, run.optimizer, 0, 0, 1)
    assert model.hidden.weight in opt.state
    run.sync.on_reset(["hidden.weight", "hidden.bias"])
    assert model.hidden.weight not in opt.state and model.hidden.bias not in opt.state and model.out.weight in opt.state


def test_finite_is_exact_where_the_fast_sum_overflows_or_cancels():
    """health.finite: the one-pass sum decides only when it is finite; otherwise the elementwise check."""
    big = torch.tensor([3e38, 3e38, -1.0])  # every element finite, the float32 sum overflows to inf
    assert health.finite(big) and health.all_finite(big, None)
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert not health.finite(torch.tensor([1.0, bad, 2.0])), bad
    assert not health.finite(torch.tensor([float("inf"), -float("inf")]))  # the sum is NaN, not a cancellation
    assert not health.finite(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16))
    assert health.finite(torch.empty(0)) and health.finite(torch.arange(5))
