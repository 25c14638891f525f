"""Hierarchical sync: real gloo workers in groups against the simulator (gossip_accel.sync.simulate.HierarchicalCluster).

2 groups x 2 ranks (4 spawned workers) for MA and BMUF; gossip needs a ring of at least 3 nodes
(Definition 1: 2p < n), so gossip-BMUF runs on 3 groups x 2 ranks (6 workers, few steps).
"""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync.config import ConfigError, HierarchyConfig, load_sync_config
from gossip_accel.sync.hierarchical import GroupLayout, HierarchicalSynchronizer, assign_carriers
from gossip_accel.sync.schedule import event_at
from group_runs import BASE, RESUMED, SCENARIOS, assert_matches_simulator, overrides_of, run
from harness import assert_states_close

HIER = [n for n in SCENARIOS if n.startswith("hier_")]


def params(state: dict) -> dict:
    return {k: v for k, v in state.items() if "running" not in k and "num_batches" not in k}


@pytest.mark.parametrize("name", HIER)
def test_hierarchical_matches_simulator(name):
    assert_matches_simulator(name)


@pytest.mark.parametrize("name", HIER)
def test_ranks_of_a_group_hold_identical_models_and_groups_differ(name):
    world = SCENARIOS[name][0]
    runs = run(name)
    for j in range(world // 2):
        a, b = params(runs[2 * j]["before"]), params(runs[2 * j + 1]["before"])
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}: group {j} ranks differ in {k}"
    # the groups are distinct replicas between syncs (no scenario ends on a sync step)
    w = [runs[r]["before"]["hidden.weight"] for r in range(0, world, 2)]
    assert any((w[0] - x).abs().max() > 1e-6 for x in w[1:]), f"{name}: groups never diverged"


def expected_cross_bytes(name: str, comp: tuple[int, int, int], wire_bytes_per_float: int) -> float:
    """Bytes one carrier sends for a component over the run with 2 groups (ring all-reduce: 2 (n-1)/n = 1)."""
    steps = SCENARIOS[name][2]
    cfg = load_sync_config(BASE, overrides_of(name))
    _, nbytes, period = comp
    syncs = sum(event_at(t, period, cfg.warmup_steps, cfg.warmup_period) is not None for t in range(1, steps + 1))
    numel = nbytes // 4
    if wire_bytes_per_float == 4:
        return syncs * nbytes * 1.0
    return syncs * 2.0 * -(-numel // 2) * wire_bytes_per_float  # reduce-scatter + all-gather of ceil(numel/2) chunks


@pytest.mark.parametrize("name,wire", [("hier_ma", 4), ("hier_bmuf_warmup", 4), ("hier_bmuf_cbm_round_robin", 4),
                                       ("hier_ma_bf16", 2)])
def test_cross_group_traffic_is_split_over_local_ranks(name, wire):
    runs = run(name)
    comps = runs[0]["components"]
    carriers = runs[0]["carriers"]
    assert set(carriers) == {0, 1}, "both local ranks carry components"
    for rank, got in enumerate(runs):
        m = got["metrics"]
        local = rank % 2
        mine = [c for c, (idx, _, _) in comps.items() if carriers[idx] == local]
        for c, spec in comps.items():
            sent = m.get(f"sync/bytes_sent/{c}", 0.0)
            if c in mine:
                assert sent == pytest.approx(expected_cross_bytes(name, spec, wire)), (name, rank, c)
            else:
                assert sent == 0.0, f"{name}: rank {rank} sent {c} across groups but does not carry it"
        # BMUF slots only for the carried components
        if "bmuf" in name:
            assert got["slots"] == sorted(mine)
        assert m["sync/intra_bytes_sent/gradients"] > 0
    # per group, the local ranks together send what one flat worker of a 2-worker run would
    total = sum(runs[r]["metrics"]["sync/bytes_sent"] for r in (0, 1))
    flat = sum(expected_cross_bytes(name, spec, wire) for spec in comps.values())
    assert total == pytest.approx(flat + sum(runs[r]["metrics"].get("sync/bytes_sent/buffers", 0.0) for r in (0, 1)))


def test_factory_chooses_from_the_config():
    assert {r["class"] for r in run("hier_ma")} == {"HierarchicalSynchronizer"}
    assert {r["class"] for r in run("ma_fp32")} == {"Synchronizer"}


def test_accelerate_builds_the_hierarchical_synchronizer_with_ddp_group_hook():
    runs = run("hier_ddp_bmuf")
    assert {r["class"] for r in runs} == {"AccelerateHierarchicalSynchronizer"}
    # DDP's own all-reduce hook ran on the group's process group (the group's ranks are equal and
    # the run equals the simulator: tests above), counted as intra-group traffic
    n_params = sum(v.numel() for k, v in runs[0]["final"].items() if "running" not in k and "num_batches" not in k)
    steps = SCENARIOS["hier_ddp_bmuf"][2]
    for r in runs:  # ring all-reduce over 2 ranks moves the gradient bytes once per step
        assert r["metrics"]["sync/intra_bytes_sent/gradients"] == pytest.approx(steps * n_params * 4)


@pytest.mark.parametrize("name", list(RESUMED))
def test_resume_from_checkpoint_equals_uninterrupted(name):
    for rank, (got, ref) in enumerate(zip(run(f"resumed_{name}"), run(name))):
        assert_states_close(got["before"], ref["before"], f"resumed {name} rank {rank}")
        assert_states_close(got["final"], ref["final"], f"resumed {name} rank {rank} final")


def test_checkpoint_of_another_layout_is_refused():
    state = {"hierarchy": {"world": 4, "group_size": 2, "global_rank": 1, "carriers": [1, 1, 0]}}
    sync = HierarchicalSynchronizer.__new__(HierarchicalSynchronizer)  # the checks need no process group
    sync.layout, sync.global_rank, sync._carrier = GroupLayout(4, 2), 3, [1, 1, 0]
    with pytest.raises(ConfigError, match="hierarchy global_rank=1 but this run has 3"):
        sync.load_state_dict(state)
    with pytest.raises(ConfigError, match="from a flat run"):
        sync.load_state_dict({})


def test_round_robin_and_balanced_carriers():
    assert assign_carriers([10, 10, 10, 10, 10], 2, "round_robin") == [0, 1, 0, 1, 0]
    # greedy by bytes: the big one alone on local rank 0, the small ones on the other
    assert assign_carriers([160, 160, 1153], 2, "balanced") == [1, 1, 0]
    assert assign_carriers([5, 1, 1, 1, 1, 1], 2, "balanced") == [0, 1, 1, 1, 1, 1]
    assert sorted(assign_carriers([3, 3, 3, 3], 4)) == [0, 1, 2, 3]


def test_layout():
    lay = GroupLayout(world=6, group_size=2)
    assert lay.groups == 3 and lay.members(1) == [2, 3] and lay.peers(1) == [1, 3, 5]
    assert lay.group_of(5) == 2 and lay.local_rank(5) == 1


@pytest.mark.parametrize("value,world,env,match", [
    (3, 4, {}, "does not divide the 4 processes"),
    (4, 4, {}, "at least 2 groups"),
    ("node", 8, {}, "LOCAL_WORLD_SIZE"),
    ("node", 4, {"LOCAL_WORLD_SIZE": "4"}, "at least 2 groups"),
])
def test_group_size_errors_name_the_key(value, world, env, match):
    with pytest.raises(ConfigError, match=match) as e:
        HierarchyConfig(group_size=value).resolved_group_size(world, env)
    assert "sync.hierarchy.group_size" in str(e.value)


def test_group_size_words():
    assert HierarchyConfig(group_size="node").resolved_group_size(8, {"LOCAL_WORLD_SIZE": "4"}) == 4
    assert HierarchyConfig(group_size="auto").resolved_group_size(8, {"LOCAL_WORLD_SIZE": "4"}) == 4
    assert HierarchyConfig(group_size="auto").resolved_group_size(4, {"LOCAL_WORLD_SIZE": "4"}) == 1
    assert HierarchyConfig(group_size="auto").resolved_group_size(4, {}) == 1
    assert HierarchyConfig(group_size=None).resolved_group_size(4, {}) == 1
    assert HierarchyConfig(group_size=1).resolved_group_size(4, {}) == 1


@pytest.mark.parametrize("overrides,match", [
    (["sync.hierarchy.group_size=two"], "sync.hierarchy.group_size='two'"),
    (["sync.hierarchy.group_size=0"], "sync.hierarchy.group_size=0"),
    (["sync.hierarchy.carriers=random"], "sync.hierarchy.carriers"),
    (["sync.hierarchy.group_size=2", "sync.algorithm=adpsgd_fixed"], "set sync.hierarchy.group_size=null"),
    (["sync.hierarchy.group_size=2", "sync.algorithm=easgd"], "set sync.hierarchy.group_size=null"),
    (["sync.hierarchy.size=2"], "size"),
])
def test_bad_hierarchy_config(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_sync_config(BASE, overrides)


def test_hierarchy_from_yaml(tmp_path):
    path = tmp_path / "sync.yaml"
    path.write_text("sync:\n  algorithm: gossip_bmuf\n  hierarchy:\n    group_size: node\n    carriers: round_robin\n")
    cfg = load_sync_config(str(path))
    assert cfg.hierarchy.group_size == "node" and cfg.hierarchy.carriers == "round_robin"
    assert cfg.hierarchy.resolved_group_size(16, {"LOCAL_WORLD_SIZE": "8"}) == 8
