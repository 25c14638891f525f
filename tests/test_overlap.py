"""sync.overlap_steps: a sync posted at step t is applied at t + tau (overlap.py, engines/overlap.py).

The distributed runs against the simulator (rank by rank, with a checkpoint taken while an exchange
is in flight, a bf16 wire, warm-up, CPU slots, hierarchy and non-finite replicas) are scenarios of
tests/test_distributed_equals_simulator.py, tests/test_hierarchical.py and tests/test_nonfinite.py.
"""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.overlap import merge_
from gossip_accel.sync.simulate import SimulatedCluster

BASE = {"components": toy.TOY_COMPONENTS, "period": 4}
CONST = 1.0 / 1024


def test_the_three_merges():
    live, snap, new = torch.tensor([5.0, 7.0]), torch.tensor([4.0, 4.0]), torch.tensor([1.0, 2.0])
    assert merge_(live.clone(), snap, new, "delta", 0.5).tolist() == [2.0, 5.0]  # new + (live - snap)
    assert merge_(live.clone(), snap, new, "mix", 0.25).tolist() == [2.0, 3.25]  # 0.25 live + 0.75 new
    assert merge_(live.clone(), snap, new, "replace", 0.5).tolist() == [1.0, 2.0]
    assert merge_(live.clone(), snap, new, "delta", 0.5, reset=True).tolist() == [1.0, 2.0]  # a reset replica


@pytest.mark.parametrize("overrides,match", [
    (["sync.overlap_steps=-1"], "must be >= 0"),
    (["sync.overlap_steps=4"], r"below every period \(the smallest is 4\)"),
    (["sync.overlap_steps=2", "sync.overlap_merge=avg"], "choose one of delta, mix, replace"),
    (["sync.overlap_mix=1.5"], r"must be in \[0, 1\]"),
    (["sync.algorithm=bmuf", "sync.overlap_steps=2", "sync.exchange_dtype=bfloat16"], "two-phase wire is blocking"),
    (["sync.algorithm=ma", "sync.overlap_steps=2", "sync.exchange_dtype=int4"],
     r"sync.overlap_steps=2 with sync.exchange_dtype=int4 on the full graph \(ma\) is not implemented"),
    (["sync.algorithm=bmuf", "sync.overlap_steps=3", "sync.exchange_dtype=int8"],
     r"sync.exchange_dtype=int8 on the full graph \(bmuf\) is not implemented \(its two-phase wire is blocking\)"),
    (["sync.algorithm=easgd", "sync.overlap_steps=2"], "sync.overlap_steps is implemented for ma, bmuf"),
])
def test_bad_overlap_config_is_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_sync_config(BASE, overrides)


def const_run(overrides, steps=23, n=4):
    """A state-independent local step: worker k adds (k + 1) / 1024 to every parameter each step."""
    models = [toy.ToyModel(seed=k) for k in range(n)]
    cluster = SimulatedCluster(models, BASE, overrides)
    for t in range(1, steps + 1):
        with torch.no_grad():
            for k, m in enumerate(models):
                for p in m.parameters():
                    p.add_((k + 1) * CONST)
        cluster.step()
    before = [torch.cat([p.detach().reshape(-1).clone() for p in m.parameters()]) for m in models]
    cluster.finalize()
    return before, torch.cat([p.detach().reshape(-1).clone() for p in models[0].parameters()])


@pytest.mark.parametrize("algorithm,wire", [
    ("bmuf", []), ("gossip_bmuf", []), ("ma", []),
    # the coded ring: the message of a sync at t is coded from theta_t, so it is the blocking run's message
    ("gossip_bmuf", ["sync.exchange_dtype=int4", "sync.stagger=true"]),
    ("local_ma", ["sync.exchange_dtype=int8", "sync.quant_ring=params", "sync.p=1"])],
    ids=["bmuf", "gossip_bmuf", "ma", "gossip_bmuf-int4-stagger", "local_ma-int8-params"])
def test_delta_merge_of_a_state_independent_step_is_the_blocking_run(algorithm, wire):
    """The derivation of docs/ALGORITHMS.md: with the delta merge, block k's G holds exactly the local steps
    (t_{k-1}, t_k], so omega and Delta follow the blocking run's sequence; when the local step does not depend
    on theta, the overlapped run equals the blocking one at every step outside the tau windows and at the end."""
    common = [f"sync.algorithm={algorithm}", "sync.block_momentum=0.9" if "bmuf" in algorithm else "sync.seed=0",
              "sync.warmup_steps=6", "sync.warmup_period=2", *wire]
    blocking_before, blocking = const_run(common)
    for tau in (1, 3):
        before, final = const_run([*common, f"sync.overlap_steps={tau}"])
        torch.testing.assert_close(final, blocking, atol=1e-5, rtol=0)
        for k in range(4):  # step 23 is outside every window (syncs at 10, 14, 18, 22 + tau > 23 for tau=3)
            if tau == 1:
                torch.testing.assert_close(before[k], blocking_before[k], atol=1e-5, rtol=0)
    _, mixed = const_run([*common, "sync.overlap_steps=3", "sync.overlap_merge=mix"])
    assert (mixed - blocking).abs().max() > 1e-3, "mix is not the blocking run (it keeps part of the old model)"


def test_the_model_changes_at_t_plus_tau_not_at_t():
    models = [toy.ToyModel(seed=k) for k in range(4)]
    cluster = SimulatedCluster(models, BASE, ["sync.algorithm=bmuf", "sync.overlap_steps=2"])
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    seen = {}
    for t in range(1, 7):
        for k in range(4):
            toy.train_step(models[k], opts[k], 7, k, t)
        trained = models[1].hidden.weight.detach().clone()
        cluster.step()
        seen[t] = torch.equal(trained, models[1].hidden.weight)  # untouched by the synchronizer?
        assert len(cluster.inflight) == (1 if t in (4, 5) else 0)  # 'rest' (period 4) posted at 4
    assert seen == {1: True, 2: True, 3: True, 4: True, 5: True, 6: False}


def test_finalize_drains_the_exchanges_in_flight():
    models = [toy.ToyModel(seed=k) for k in range(4)]
    cluster = SimulatedCluster(models, BASE, ["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.overlap_steps=3"])
    for t in range(1, 10):
        with torch.no_grad():
            for k, m in enumerate(models):
                m.hidden.weight.add_((k + 1) * CONST)
        cluster.step()
    assert cluster.inflight  # 'rest' posted at 8, due at 11
    cluster.finalize()
    assert not cluster.inflight
    for m in models[1:]:
        torch.testing.assert_close(m.hidden.weight, models[0].hidden.weight)


@pytest.mark.parametrize("algorithm", ["gossip_ma", "gossip_bmuf", "local_ma", "local_bmuf"])
def test_the_coded_ring_may_be_overlapped(algorithm):
    for wire in ("sync.exchange_dtype=int8", "sync.exchange_dtype=int4"):
        cfg = load_sync_config(BASE, [f"sync.algorithm={algorithm}", wire, "sync.overlap_steps=3", "sync.stagger=true"])
        assert cfg.overlap_steps == 3


def test_config_default_is_blocking():
    cfg = load_sync_config(BASE)
    assert (cfg.overlap_steps, cfg.overlap_merge, cfg.stagger) == (0, "delta", False)


def _dropped_worker(rank: int, world: int, init_file: str, outdir: str) -> None:
    import gc
    import os
    import warnings

    import torch.distributed as dist

    from gossip_accel import shutdown
    from harness import build, train

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model, opt, sync = build(rank, ["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.overlap_steps=3"])
    train(rank, model, opt, sync, 9)  # 'rest' (period 4) posted at 8, due at 11: in flight
    del model, opt, sync
    gc.collect()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        shutdown()
    with open(os.path.join(outdir, f"warned{rank}.txt"), "w") as f:
        f.write("\n".join(str(w.message) for w in seen))


def test_shutdown_waits_for_the_exchanges_of_a_dropped_synchronizer(tmp_path):
    """A Synchronizer dropped with an overlapped exchange in flight: shutdown() waits for it (the group is
    destroyed without a hang or abort) and warns, naming the component; nothing is left in flight."""
    import tempfile

    from harness import spawn_with_timeout

    init_file = tempfile.mktemp(prefix="gloo_init_", dir=tmp_path)
    spawn_with_timeout(_dropped_worker, (3, init_file, str(tmp_path)), 3, timeout=120)  # a ring needs 3
    for rank in range(3):
        text = (tmp_path / f"warned{rank}.txt").read_text()
        assert "still in flight for embedding.shard0, embedding.shard1, rest:" in text and "finalize()" in text, text
