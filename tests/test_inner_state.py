"""sync.inner_state (gossip_accel/sync/inner_state.py): which optimizer state belongs to a component, what
reset and average do to it in the simulator, and the errors. The distributed runs against the simulator
(and their bytes, and resume) are in tests/test_distributed_equals_simulator.py."""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.components import split_components
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.inner_state import reset_, state_slices
from gossip_accel.sync.simulate import SimulatedCluster
from harness import BASE, DATA_SEED, initial_model

RULES = load_sync_config(BASE).components


def _stepped(opt_cls, **kw):
    model = initial_model(0)
    opt = opt_cls(model.parameters(), **kw)
    toy.train_step(model, opt, DATA_SEED, 0, 1)
    return model, opt, split_components(model.named_parameters(), RULES, 4)


def test_slices_are_the_components_rows_of_every_state_tensor():
    model, opt, comps = _stepped(torch.optim.Adam, lr=1e-3)
    shard1 = next(c for c in comps if c.name == "embedding.shard1")
    slices = state_slices(shard1, [opt])
    state = opt.state[model.embedding.weight]
    rows = model.embedding.weight.shape[0] // 2
    # exp_avg and exp_avg_sq (sorted by key), rows [rows:] of each; the scalar step is not a slice
    assert [s.view.numel() for s in slices] == [rows * toy.EMB] * 2
    torch.testing.assert_close(slices[0].view, state["exp_avg"][rows:].reshape(-1))
    torch.testing.assert_close(slices[1].view, state["exp_avg_sq"][rows:].reshape(-1))
    rest = next(c for c in comps if c.name == "rest")
    assert sum(s.view.numel() for s in state_slices(rest, [opt])) == 2 * rest.numel


def test_reset_returns_to_the_initial_state():
    model, opt, comps = _stepped(torch.optim.Adagrad, lr=0.1, initial_accumulator_value=0.25)
    rest = next(c for c in comps if c.name == "rest")
    reset_(state_slices(rest, [opt]))
    for p in model.hidden.parameters():
        assert torch.all(opt.state[p]["sum"] == 0.25) and float(opt.state[p]["step"]) == 0
    assert not torch.all(opt.state[model.embedding.weight]["sum"] == 0.25)  # another component: kept
    model, opt, comps = _stepped(torch.optim.SGD, lr=0.1, momentum=0.9)
    reset_(state_slices(comps[0], [opt]))
    assert not opt.state[model.embedding.weight]["momentum_buffer"][:toy.VOCAB // 2].any()
    assert opt.state[model.embedding.weight]["momentum_buffer"][toy.VOCAB // 2:].any()


def _cluster(overrides, steps, n=4):
    models = [initial_model(k) for k in range(n)]
    opts = [torch.optim.Adagrad(m.parameters(), lr=0.05) for m in models]
    cluster = SimulatedCluster(models, BASE, overrides, optimizers=opts)
    for t in range(1, steps + 1):
        for k in range(n):
            toy.train_step(models[k], opts[k], DATA_SEED, k, t)
        cluster.step()
    return models, opts


def test_simulated_average_makes_the_states_equal_on_the_full_graph():
    models, opts = _cluster(["sync.algorithm=ma", "sync.inner_state=average"], 4)  # "rest" synced at 4
    sums = [o.state[m.hidden.weight]["sum"] for m, o in zip(models, opts)]
    for s in sums[1:]:
        torch.testing.assert_close(s, sums[0])
    emb = [o.state[m.embedding.weight]["sum"] for m, o in zip(models, opts)]  # period 8: not yet
    assert any(not torch.equal(emb[0], e) for e in emb[1:])


def test_simulated_gossip_averages_the_state_with_the_parameters_neighbours():
    over = ["sync.algorithm=gossip_ma", "sync.p=1", "sync.q=1", "sync.seed=3"]
    kept_models, kept_opts = _cluster(over, 4)  # the states of step 4 as they were before its sync
    models, opts = _cluster([*over, "sync.inner_state=average"], 4)
    cluster = SimulatedCluster([initial_model(k) for k in range(4)], BASE, over)
    rest = next(c.index for c in cluster.comps[0] if c.name == "rest")  # period 4: its round 1 at step 4
    plan = cluster.topology.plan(rest, 1)
    kept = [o.state[m.hidden.weight]["sum"] for m, o in zip(kept_models, kept_opts)]
    for k in range(4):
        (j,) = plan.recv_from[k]
        torch.testing.assert_close(opts[k].state[models[k].hidden.weight]["sum"], (kept[k] + kept[j]) / 2)
        torch.testing.assert_close(opts[k].state[models[k].embedding.weight]["sum"],  # period 8: not yet
                                   kept_opts[k].state[kept_models[k].embedding.weight]["sum"])


def test_errors_name_the_key():
    with pytest.raises(ConfigError, match="sync.inner_state='avg'; choose one of keep, reset, average"):
        load_sync_config(None, ["sync.inner_state=avg"])
    with pytest.raises(ConfigError, match="sync.inner_state=reset is implemented for the flat ma, bmuf"):
        load_sync_config(None, ["sync.algorithm=easgd", "sync.inner_state=reset"])
    with pytest.raises(ConfigError, match="give SimulatedCluster one optimizer per replica"):
        SimulatedCluster([initial_model(k) for k in range(2)], BASE, ["sync.inner_state=average"])
