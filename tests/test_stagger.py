"""sync.stagger: components that share a period sync at different steps of it (schedule.py).

The distributed run of a staggered gossip-BMUF against the simulator (rank by rank, and so the
gossip draws identical on every rank) is the scenario ``gossip_bmuf_stagger`` of
tests/test_distributed_equals_simulator.py.
"""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.schedule import applied_at, event_at, stagger_offsets
from gossip_accel.sync.simulate import SimulatedCluster

LM_PERIODS = [128] * 8 + [16] * 6  # (16,128): 8 embedding shards, lstm, projection, head, 3 tails


def test_offsets_are_floor_k_h_over_k_per_period():
    offsets = stagger_offsets(LM_PERIODS, True)
    assert offsets[:8] == [0, 16, 32, 48, 64, 80, 96, 112]
    assert offsets[8:] == [0, 2, 5, 8, 10, 13]  # floor(k 16 / 6)
    assert stagger_offsets(LM_PERIODS, False) == [0] * len(LM_PERIODS)
    assert stagger_offsets([4, 8, 4, 8, 8], True) == [0, 0, 2, 2, 5]  # groups interleaved in component order


def test_every_component_syncs_once_per_period_at_its_own_step():
    offsets = stagger_offsets(LM_PERIODS, True)
    warmup = 32
    for i, (h, o) in enumerate(zip(LM_PERIODS, offsets)):
        steps = [t for t in range(1, warmup + 4 * 128 + 1)
                 if (ev := event_at(t, h, warmup, 8, o)) is not None and ev.kind == "sync"]
        gaps = {b - a for a, b in zip(steps, steps[1:])}
        assert gaps == {h}, f"component {i}: period {h} kept"
        assert steps[0] == warmup + h - o  # the first sync after warm-up (o = 0: at W + H, as before)
        rounds = [event_at(t, h, warmup, 8, o).round for t in steps]
        assert rounds == list(range(1, len(steps) + 1)), "rounds (the gossip draw seeds) count from 1"
    # the 8 embedding shards: 8 different steps in every 128, one each
    for start in range(warmup + 1, warmup + 3 * 128, 128):
        hits = [sum(event_at(t, 128, warmup, 8, o) is not None for o in offsets[:8]) for t in range(start, start + 128)]
        assert sum(hits) == 8 and max(hits) == 1


def test_warmup_is_not_staggered():
    for o in (0, 3, 7):
        assert [event_at(t, 8, 6, 2, o).kind for t in (2, 4, 6)] == ["warmup", "warmup", "warmup_end"]


def test_applied_at_says_when_the_parameters_change():
    # blocking: at the sync steps; overlapped by tau = 2: two steps later (warm-up averages stay blocking)
    blocking = [t for t in range(1, 30) if applied_at(t, 8, 4, 2, 3, 0)]
    overlapped = [t for t in range(1, 30) if applied_at(t, 8, 4, 2, 3, 2)]
    assert blocking == [2, 4, 9, 17, 25]
    assert overlapped == [2, 4, 11, 19, 27]


def test_simulator_and_config_carry_the_offsets():
    models = [toy.ToyModel(seed=k) for k in range(4)]
    cluster = SimulatedCluster(models, {"components": toy.TOY_COMPONENTS, "period": 4},
                               ["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.stagger=true"])
    assert [c.offset for c in cluster.comps[2]] == [0, 4, 0]  # embedding.shard0/1 (period 8), rest (period 4)


def test_stagger_changes_only_the_sync_steps():
    """A staggered run is a run whose shards sync at other steps: with the offsets at 0 it is today's run."""
    base = {"components": toy.TOY_COMPONENTS, "period": 4}

    def run(overrides):
        models = [toy.ToyModel(seed=k) for k in range(4)]
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
        cluster = SimulatedCluster(models, base, ["sync.algorithm=gossip_bmuf", "sync.q=1", *overrides])
        for t in range(1, 15):
            for k in range(4):
                toy.train_step(models[k], opts[k], 7, k, t)
            cluster.step()
        return models[0].embedding.weight.detach().clone()

    plain, off, on = run([]), run(["sync.stagger=false"]), run(["sync.stagger=true"])
    assert torch.equal(plain, off)
    assert not torch.equal(plain, on)


@pytest.mark.parametrize("algorithm", ["easgd", "asgd", "adpsgd_fixed"])
def test_stagger_is_refused_where_not_implemented(algorithm):
    with pytest.raises(ConfigError, match="sync.stagger is implemented for ma, bmuf"):
        load_sync_config(None, [f"sync.algorithm={algorithm}", "sync.stagger=true"])
