"""Without torch.distributed (or with one process) the synchronizer is a warned no-op."""
from __future__ import annotations

import pytest
import torch

from gossip_accel import ConfigError, SyncedOptimizer, Synchronizer
from gossip_accel.sync import toy


def test_single_process_warns_and_trains_locally():
    model = toy.ToyModel(seed=0)
    with pytest.warns(UserWarning, match="single process"):
        sync = Synchronizer(model, {"components": toy.TOY_COMPONENTS, "period": 2})
    opt = SyncedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), sync)
    with sync:
        losses = [toy.train_step(model, opt, 0, 0, t) for t in range(1, 41)]
    assert sync.t == 40
    assert sum(losses[-10:]) < sum(losses[:10])
    assert sync.metrics()["sync/step"] == 40.0
    state = opt.state_dict()
    assert state["synchronizer"]["t"] == 40 and "optimizer" in state


def test_state_from_another_setup_is_refused():
    model = toy.ToyModel(seed=0)
    with pytest.warns(UserWarning):
        sync = Synchronizer(model, {"algorithm": "bmuf"})
    state = sync.state_dict()
    state["algorithm"] = "gossip_bmuf"
    with pytest.raises(ConfigError, match="algorithm"):
        sync.load_state_dict(state)


def test_state_of_another_outer_optimizer_is_refused():
    outer = {"name": "SGD", "lr": 0.7, "momentum": 0.9, "nesterov": True}
    with pytest.warns(UserWarning):
        sync = Synchronizer(toy.ToyModel(seed=0), {"algorithm": "bmuf", "outer_optimizer": outer})
    state = sync.state_dict()
    assert state["outer_optimizer"] == outer
    for other in (None, {**outer, "name": "Adam"}):  # a BMUF-rule checkpoint, another optimizer
        with pytest.raises(ConfigError, match="outer_optimizer"):
            sync.load_state_dict({**state, "outer_optimizer": other})


def test_bad_component_rule_names_parameter():
    model = toy.ToyModel(seed=0)
    with pytest.raises(ConfigError, match="hidden.weight"):
        Synchronizer(model, {"components": [{"name": "a", "pattern": "weight"}, {"name": "b", "pattern": "hidden"}]})


def test_make_optimizer_by_name():
    """train.optimizer of both trainers: the torch optimizers, Kaldi's NG-SGD, and a clear error."""
    from gossip_accel.train.ngsgd import NGSGD
    from gossip_accel.train.optimizers import OPTIMIZERS, make_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    for name in OPTIMIZERS:
        opt = make_optimizer(name, model, 0.1, weight_decay=0.01)
        assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["weight_decay"] == 0.01
    assert isinstance(make_optimizer("ngsgd", model, 0.1), NGSGD)
    with pytest.raises(ConfigError, match="train.optimizer='lbfgs'"):
        make_optimizer("lbfgs", model, 0.1)
