"""load_sync_config: sources, overrides, validation, and the section 3.3 defaults of p, q, eta."""
from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from gossip_accel.sync.config import ALGORITHMS, ComponentRule, ConfigError, SyncConfig, load_sync_config
from gossip_accel.sync.topology import FullTopology, RingTopology, make_topology

YAML = """\
sync:
  algorithm: gossip_bmuf
  period: 16
  p: 1
  q: 1
  block_momentum: 0.9
  block_lr: 1.0
  nesterov: true
  components:
    - {name: embedding, pattern: '^embedding\\.', period: 128, shards: 8}
    - {name: rest}
"""


def test_defaults_from_none():
    cfg = load_sync_config(None)
    assert isinstance(cfg, SyncConfig)
    assert cfg == SyncConfig()
    assert cfg.algorithm == "gossip_bmuf" and cfg.period == 16
    assert cfg.p is None and cfg.q is None and cfg.block_momentum is None
    assert cfg.block_lr == 1.0 and cfg.nesterov is True and cfg.buffers == "average"
    assert len(cfg.components) == 1
    assert isinstance(cfg.components[0], ComponentRule)
    assert cfg.components[0].name == "all" and cfg.components[0].pattern is None
    assert load_sync_config() == SyncConfig()


def test_from_sync_section_dict():
    cfg = load_sync_config({"algorithm": "bmuf", "period": 8, "nesterov": False,
                            "components": [{"name": "e", "pattern": "^e", "shards": 2}, {"name": "rest"}]})
    assert cfg.algorithm == "bmuf" and cfg.period == 8 and cfg.nesterov is False
    assert cfg.components == [ComponentRule(name="e", pattern="^e", shards=2), ComponentRule(name="rest")]


def test_from_dict_with_top_level_sync_key():
    cfg = load_sync_config({"model": {"layers": 2}, "sync": {"algorithm": "local_ma", "period": 4}})
    assert cfg.algorithm == "local_ma" and cfg.period == 4
    dc = OmegaConf.create({"sync": {"algorithm": "ma"}})
    assert load_sync_config(dc).algorithm == "ma"


def test_from_syncconfig_object():
    src = SyncConfig(algorithm="local_bmuf", period=3)
    cfg = load_sync_config(src, ["sync.period=5"])
    assert cfg.algorithm == "local_bmuf" and cfg.period == 5


def test_from_yaml_file(tmp_path):
    path = tmp_path / "sync.yaml"
    path.write_text(YAML)
    for src in (str(path), path):
        cfg = load_sync_config(src)
        assert cfg.algorithm == "gossip_bmuf"
        assert (cfg.period, cfg.p, cfg.q) == (16, 1, 1)
        assert cfg.block_momentum == pytest.approx(0.9)
        assert cfg.components[0] == ComponentRule(name="embedding", pattern=r"^embedding\.", period=128, shards=8)
        assert cfg.components[1] == ComponentRule(name="rest")


def test_yaml_file_without_sync_key(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text("algorithm: ma\nperiod: 2\n")
    cfg = load_sync_config(str(path))
    assert cfg.algorithm == "ma" and cfg.period == 2


def test_dotlist_overrides_with_and_without_prefix(tmp_path):
    path = tmp_path / "sync.yaml"
    path.write_text(YAML)
    cfg = load_sync_config(str(path), ["sync.period=8", "algorithm=local_bmuf", "sync.q=2", "nesterov=false"])
    assert cfg.period == 8 and cfg.algorithm == "local_bmuf" and cfg.q == 2 and cfg.nesterov is False
    cfg = load_sync_config(None, ["sync.block_momentum=0.5", "block_lr=2.0", "sync.buffers=local"])
    assert cfg.block_momentum == 0.5 and cfg.block_lr == 2.0 and cfg.buffers == "local"
    cfg = load_sync_config({"sync": {"period": 4}}, ["sync.period=6"])
    assert cfg.period == 6  # overrides win over the source


def test_int_given_for_float_is_accepted():
    cfg = load_sync_config(None, ["sync.block_lr=2"])
    assert cfg.block_lr == 2.0 and isinstance(cfg.block_lr, float)


# -- errors name the key -----------------------------------------------------------------------
def err(source=None, overrides=()):
    with pytest.raises(ConfigError) as e:
        load_sync_config(source, overrides)
    return str(e.value)


def test_unknown_algorithm():
    msg = err(overrides=["sync.algorithm=gossip_sgd"])
    assert "sync.algorithm" in msg and "gossip_sgd" in msg
    for a in ALGORITHMS:
        assert a in msg  # lists the choices


def test_unknown_key():
    msg = err(overrides=["sync.perod=3"])
    assert "perod" in msg
    assert "perod" in err({"perod": 3})


def test_wrong_type():
    msg = err(overrides=["sync.period=abc"])
    assert "period" in msg and "abc" in msg
    assert "nesterov" in err(overrides=["sync.nesterov=maybe"])


def test_period_zero():
    msg = err(overrides=["sync.period=0"])
    assert "sync.period=0" in msg


def test_block_momentum_one():
    msg = err(overrides=["sync.block_momentum=1.0"])
    assert "sync.block_momentum" in msg
    assert "sync.block_momentum" in err(overrides=["sync.block_momentum=-0.1"])
    assert load_sync_config(None, ["sync.block_momentum=0.0"]).block_momentum == 0.0


def test_bad_buffers_policy():
    msg = err(overrides=["sync.buffers=sum"])
    assert "sync.buffers" in msg and "sum" in msg


def test_duplicate_component_names():
    msg = err({"components": [{"name": "a", "pattern": "x"}, {"name": "a"}]})
    assert "sync.components[1].name" in msg and "'a'" in msg


def test_component_period_and_shards_validated():
    assert "sync.components[0].period" in err({"components": [{"name": "a", "period": 0}]})
    assert "sync.components[1].shards" in err({"components": [{"name": "a", "pattern": "x"},
                                                             {"name": "b", "shards": 0}]})


def test_empty_components():
    assert "sync.components" in err({"components": []})


def test_other_values_validated():
    assert "sync.block_lr" in err(overrides=["sync.block_lr=0"])
    assert "sync.p" in err(overrides=["sync.p=0"])
    assert "sync.q" in err(overrides=["sync.q=0"])
    assert "sync.warmup_period" in err(overrides=["sync.warmup_period=0"])
    assert "sync.warmup_steps" in err(overrides=["sync.warmup_steps=-1"])


def test_missing_yaml_file(tmp_path):
    missing = tmp_path / "nope" / "sync.yaml"
    msg = err(str(missing))
    assert str(missing) in msg


# -- derived quantities (section 3.3 of 000_07fa007f7f1023ae.txt) ------------------------------
@pytest.mark.parametrize(
    "n, p, q_gossip, q_local",
    [(4, 1, 1, 2), (8, 2, 2, 4), (16, 3, 2, 6)],  # the paper's settings for 4, 8 and 16 GPUs
)
def test_resolved_p_q_defaults_match_section_3_3(n, p, q_gossip, q_local):
    for algo in ("gossip_ma", "gossip_bmuf"):
        cfg = load_sync_config(None, [f"sync.algorithm={algo}"])
        assert cfg.resolved_p(n) == p
        assert cfg.resolved_q(n) == q_gossip
    for algo in ("local_ma", "local_bmuf"):
        cfg = load_sync_config(None, [f"sync.algorithm={algo}"])
        assert cfg.resolved_p(n) == p
        assert cfg.resolved_q(n) == q_local


def test_resolved_p_formula():
    cfg = SyncConfig()
    # p = max(1, round(log2 n) - 1)
    assert [cfg.resolved_p(n) for n in (1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64)] == [1, 1, 1, 1, 1, 2, 2, 3, 3, 4, 5]


def test_explicit_p_q_win():
    cfg = load_sync_config(None, ["sync.algorithm=gossip_ma", "sync.p=3", "sync.q=5"])
    assert cfg.resolved_p(4) == 3 and cfg.resolved_q(4) == 5
    cfg = load_sync_config(None, ["sync.algorithm=local_ma", "sync.p=2"])
    assert cfg.resolved_q(16) == 4  # 2p with the explicit p
    cfg = load_sync_config(None, ["sync.algorithm=gossip_ma", "sync.p=1"])
    assert cfg.resolved_q(16) == 1  # min(p, 2)


def test_resolved_block_momentum():
    cfg = load_sync_config(None, ["sync.algorithm=bmuf"])
    assert cfg.resolved_block_momentum(4) == pytest.approx(0.75)  # zeta*n*(1-eta) = C = 1
    assert cfg.resolved_block_momentum(8) == pytest.approx(0.875)
    cfg = load_sync_config(None, ["sync.block_lr=0.5", "sync.momentum_rule_c=1.0"])
    assert cfg.resolved_block_momentum(4) == pytest.approx(0.5)
    cfg = load_sync_config(None, ["sync.momentum_rule_c=2.0"])
    assert cfg.resolved_block_momentum(8) == pytest.approx(0.75)
    cfg = load_sync_config(None, ["sync.block_momentum=0.3"])
    assert cfg.resolved_block_momentum(8) == pytest.approx(0.3)  # an explicit value wins


def test_uses_bmuf_and_graph():
    expect = {"ma": (False, "full"), "bmuf": (True, "full"), "local_ma": (False, "ring"),
              "local_bmuf": (True, "ring"), "gossip_ma": (False, "ring"), "gossip_bmuf": (True, "ring")}
    for algo, (bmuf, graph) in expect.items():
        cfg = load_sync_config(None, [f"sync.algorithm={algo}"])
        assert (cfg.uses_bmuf, cfg.graph) == (bmuf, graph)


# -- values that validate() must reject (library bugs at the time of writing) ----------------------
@pytest.mark.parametrize("c", ["0", "0.0", "-1.0"])
def test_nonpositive_momentum_rule_c_is_an_error(c):
    # zeta*n*(1-eta) = C with C <= 0 gives eta = 1 - C/(n*zeta) >= 1: an unbounded block
    # momentum that sync.block_momentum=1.0 itself is refused for (see test_block_momentum_one)
    msg = err(overrides=["sync.algorithm=bmuf", f"sync.momentum_rule_c={c}"])
    assert "sync.momentum_rule_c" in msg


def test_every_valid_config_resolves_block_momentum_below_one():
    for c in (0.5, 1.0, 3.0, 100.0):
        cfg = load_sync_config(None, ["sync.algorithm=bmuf", f"sync.momentum_rule_c={c}"])
        for n in (1, 2, 4, 8, 64):
            assert 0.0 <= cfg.resolved_block_momentum(n) < 1.0


def test_negative_seed_is_an_error():
    # the neighbour draw seeds numpy's SeedSequence with (seed, component, round, node), which
    # refuses negative entropy: a negative seed must be refused up front, naming the key,
    # instead of failing with numpy's "expected non-negative integer" at the first gossip round
    msg = err(overrides=["sync.algorithm=gossip_bmuf", "sync.seed=-1"])
    assert "sync.seed" in msg


# -- issue 7: EASGD, ASGD, ADPSGD ---------------------------------------------------------------------
def test_new_algorithms_graph_and_mode():
    expect = {"easgd": ("server", False), "easgd_async": ("server", True), "asgd": ("server", True),
              "adpsgd_fixed": ("ring", True), "adpsgd_random": ("ring", True), "adpsgd_delay": ("ring", True)}
    for algo, (graph, is_async) in expect.items():
        cfg = load_sync_config(None, [f"sync.algorithm={algo}"])
        assert (cfg.graph, cfg.is_async, cfg.uses_bmuf) == (graph, is_async, False)
        assert cfg.uses_rpc == is_async
        assert not load_sync_config(None, [f"sync.algorithm={algo}", "sync.lockstep=true"]).uses_rpc


def test_new_keys_defaults():
    cfg = load_sync_config(None)
    assert cfg.server_rank == 0 and cfg.server_lr == 1.0 and cfg.max_staleness is None
    assert cfg.lockstep is False and cfg.rpc_timeout > 0 and cfg.rpc_init_method is None
    assert cfg.easgd_alpha is None and cfg.easgd_lambda is None and cfg.easgd_eta is None


@pytest.mark.parametrize("override, key", [
    ("sync.server_rank=-1", "sync.server_rank"), ("sync.server_lr=-0.5", "sync.server_lr"),
    ("sync.max_staleness=-2", "sync.max_staleness"), ("sync.rpc_timeout=0", "sync.rpc_timeout"),
])
def test_new_keys_validation(override, key):
    assert key in err(overrides=["sync.algorithm=asgd", override])


@pytest.mark.parametrize("algo", ["easgd", "easgd_async", "asgd", "adpsgd_fixed", "adpsgd_random", "adpsgd_delay"])
def test_warmup_is_refused_for_the_new_algorithms(algo):
    assert "sync.warmup_steps" in err(overrides=[f"sync.algorithm={algo}", "sync.warmup_steps=3"])


def test_validate_for_world():
    from gossip_accel.sync.config import validate_for_world

    validate_for_world(load_sync_config(None, ["sync.algorithm=asgd", "sync.server_rank=3"]), 4)
    with pytest.raises(ConfigError, match="sync.server_rank"):
        validate_for_world(load_sync_config(None, ["sync.algorithm=asgd", "sync.server_rank=3"]), 2)
    validate_for_world(load_sync_config(None, ["sync.algorithm=ma", "sync.server_rank=9"]), 2)  # unused there


@pytest.mark.parametrize("overrides,match", [
    (["sync.mixing=push"], "sync.mixing='push'; choose one of pull, pair"),
    (["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.q=2"], "one partner per round, but sync.q=2"),
])
def test_mixing_is_validated(overrides, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        load_sync_config(None, overrides)


@pytest.mark.parametrize("algorithm,graph", [("bmuf", FullTopology), ("ma", FullTopology),
                                             ("local_bmuf", RingTopology), ("local_ma", RingTopology)])
def test_pair_mixing_leaves_algorithms_without_gossip_rounds_alone(algorithm, graph):
    """One recipe conf (``mixing: pair``) serves every algorithm: MA/BMUF keep the full graph and the
    local variants all 2p ring neighbours."""
    cfg = load_sync_config(None, [f"sync.algorithm={algorithm}", "sync.mixing=pair"])
    assert cfg.round_mixing == "pull"
    topo = make_topology(algorithm, 8, cfg.resolved_p(8), cfg.resolved_q(8), 0, cfg.round_mixing)
    assert type(topo) is graph
    if cfg.spec.all_neighbours:
        assert cfg.resolved_q(8) == 2 * cfg.resolved_p(8)


def test_pair_mixing_has_one_partner_whatever_p():
    cfg = load_sync_config(None, ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.p=3"])
    assert cfg.resolved_q(16) == 1


# -- sync.outer_optimizer (algorithms/outer.py) ------------------------------------------------------
def test_outer_optimizer_from_yaml_and_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("sync:\n  algorithm: bmuf\n  outer_optimizer: {name: SGD, lr: 0.7, momentum: 0.9, nesterov: true}\n")
    cfg = load_sync_config(str(f))
    assert cfg.outer_optimizer == {"name": "SGD", "lr": 0.7, "momentum": 0.9, "nesterov": True}
    cfg = load_sync_config(None, ["sync.algorithm=gossip_bmuf", "sync.outer_optimizer={name: Adam, betas: [0.8, 0.9]}"])
    assert cfg.outer_optimizer == {"name": "Adam", "betas": [0.8, 0.9]}
    assert load_sync_config(None).outer_optimizer is None  # the paper's BMUF rule


@pytest.mark.parametrize("value, match", [
    ("{name: Sgd, lr: 1}", "sync.outer_optimizer.name='Sgd' is not a torch.optim optimizer; choose one of"),
    ("{lr: 1}", "sync.outer_optimizer.name=None is not a torch.optim optimizer"),
    ("{name: SGD, lr: 1, mom: 0.9}", "sync.outer_optimizer.mom is not an argument of torch.optim.SGD"),
    ("{name: SGD, lr: -1}", "torch.optim.SGD refuses it: Invalid learning rate: -1"),
    ("{name: SGD, lr: 1, nesterov: true}", "Nesterov momentum requires a momentum"),
    ("{name: LBFGS}", "torch.optim.LBFGS refuses it"),  # needs a closure: refused before training
    ("SGD", "Cannot assign str to Dict[str, Any] (key outer_optimizer)"),  # not a mapping: omegaconf names the key
])
def test_outer_optimizer_errors_name_the_key(value, match):
    msg = err(overrides=["sync.algorithm=bmuf", f"sync.outer_optimizer={value}"])
    assert match in msg and "\n" not in msg


@pytest.mark.parametrize("algo", ["ma", "gossip_ma", "local_ma", "easgd", "asgd", "adpsgd_fixed"])
def test_outer_optimizer_is_refused_without_bmuf_slots(algo):
    msg = err(overrides=[f"sync.algorithm={algo}", "sync.outer_optimizer={name: SGD, lr: 1}"])
    assert f"sync.outer_optimizer replaces the BMUF rule of bmuf, local_bmuf, gossip_bmuf; {algo}" in msg


def test_outer_optimizer_warns_that_block_momentum_is_unused():
    with pytest.warns(UserWarning, match="sync.block_momentum=0.5 is unused"):
        load_sync_config(None, ["sync.algorithm=bmuf", "sync.block_momentum=0.5", "sync.outer_optimizer={name: SGD, lr: 1}"])


def test_inner_state_with_overlap_is_refused():
    with pytest.raises(ConfigError, match=re.escape("sync.inner_state=average with sync.overlap_steps=2")):
        load_sync_config(None, ["sync.algorithm=bmuf", "sync.inner_state=average", "sync.overlap_steps=2"])


@pytest.mark.parametrize("overrides,match", [
    (["sync.algorithm=bmuf", "sync.overlap_steps=2", "sync.exchange_dtype=int8"],
     "sync.overlap_steps=2 with sync.exchange_dtype=int8 on the full graph (bmuf)"),
    (["sync.inner_state=average", "sync.exchange_dtype=int4"], "sync.inner_state=average with sync.exchange_dtype=int4"),
])
def test_combinations_not_implemented_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        load_sync_config(None, ["sync.algorithm=gossip_bmuf", *overrides])
