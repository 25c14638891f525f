"""Splitting a model into components theta_i (section 2.2 / 3.2 of 000_07fa007f7f1023ae.txt)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from gossip_accel.sync.components import Component, split_buffers, split_components
from gossip_accel.sync.config import ComponentRule, ConfigError


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = nn.Embedding(5, 3)      # emb.weight (5, 3)
        self.lin = nn.Linear(3, 2)         # lin.weight (2, 3), lin.bias (2,)
        self.bn = nn.BatchNorm1d(2)        # bn.weight (2,), bn.bias (2,) + buffers
        self.head = nn.Linear(2, 1)        # head.weight (1, 2), head.bias (1,)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))


def names(comp: Component) -> list[str]:
    return [p.name for p in comp.pieces]


RULES = [
    ComponentRule(name="emb", pattern=r"^emb\.", period=8, shards=2),
    ComponentRule(name="head", pattern=r"^head\."),
    ComponentRule(name="rest"),
]


def test_rules_by_regex_with_catch_all():
    net = Net()
    comps = split_components(net.named_parameters(), RULES, default_period=16)
    assert [c.name for c in comps] == ["emb.shard0", "emb.shard1", "head", "rest"]
    assert [c.index for c in comps] == [0, 1, 2, 3]
    assert names(comps[0]) == ["emb.weight[0:3]"]
    assert names(comps[1]) == ["emb.weight[3:5]"]
    assert names(comps[2]) == ["head.weight", "head.bias"]
    # the catch-all takes everything else, in the model's order
    assert names(comps[3]) == ["lin.weight", "lin.bias", "bn.weight", "bn.bias"]
    # every trainable parameter lands in exactly one component
    assert sum(c.numel for c in comps) == sum(p.numel() for p in net.parameters())


def test_catch_all_rule_may_come_first_and_components_keep_rule_order():
    net = Net()
    rules = [ComponentRule(name="rest"), ComponentRule(name="lin", pattern=r"^lin\.")]
    comps = split_components(net.named_parameters(), rules, default_period=4)
    assert [c.name for c in comps] == ["rest", "lin"]
    assert names(comps[0]) == ["emb.weight", "bn.weight", "bn.bias", "head.weight", "head.bias"]
    assert names(comps[1]) == ["lin.weight", "lin.bias"]


def test_re_search_semantics_not_fullmatch():
    net = Net()
    rules = [ComponentRule(name="biases", pattern="bias"), ComponentRule(name="rest")]
    comps = split_components(net.named_parameters(), rules, default_period=4)
    assert names(comps[0]) == ["lin.bias", "bn.bias", "head.bias"]


def test_single_default_rule_takes_everything():
    net = Net()
    comps = split_components(net.named_parameters(), [ComponentRule()], default_period=16)
    assert len(comps) == 1
    assert comps[0].name == "all" and comps[0].period == 16
    assert names(comps[0]) == [n for n, _ in net.named_parameters()]


def test_periods_default_and_override():
    net = Net()
    comps = split_components(net.named_parameters(), RULES, default_period=16)
    assert {c.name: c.period for c in comps} == {"emb.shard0": 8, "emb.shard1": 8, "head": 16, "rest": 16}
    comps = split_components(net.named_parameters(), RULES, default_period=3)
    assert {c.name: c.period for c in comps} == {"emb.shard0": 8, "emb.shard1": 8, "head": 3, "rest": 3}


@pytest.mark.parametrize("rows, k, sizes", [(5, 2, [3, 2]), (6, 3, [2, 2, 2]), (7, 3, [3, 2, 2]), (4, 4, [1, 1, 1, 1])])
def test_row_sharding_shapes_and_names(rows, k, sizes):
    emb = nn.Embedding(rows, 3)
    rules = [ComponentRule(name="E", pattern="weight", shards=k)]
    comps = split_components(emb.named_parameters(), rules, default_period=2)
    assert [c.name for c in comps] == [f"E.shard{j}" for j in range(k)]
    assert [c.pieces[0].view.shape for c in comps] == [torch.Size([s, 3]) for s in sizes]
    assert [c.numel for c in comps] == [3 * s for s in sizes]
    lo = 0
    for c, s in zip(comps, sizes):
        assert names(c) == [f"weight[{lo}:{lo + s}]"]
        assert torch.equal(c.pieces[0].view, emb.weight.data[lo:lo + s])
        lo += s


def test_sharding_covers_several_parameters_per_shard():
    lin = nn.Linear(3, 4)  # weight (4, 3), bias (4,)
    comps = split_components(lin.named_parameters(), [ComponentRule(name="L", shards=2)], default_period=1)
    assert [c.name for c in comps] == ["L.shard0", "L.shard1"]
    assert names(comps[0]) == ["weight[0:2]", "bias[0:2]"]
    assert names(comps[1]) == ["weight[2:4]", "bias[2:4]"]
    assert comps[0].numel == 2 * 3 + 2


def test_shard_views_share_storage_and_scatter_writes_the_model():
    net = Net()
    comps = split_components(net.named_parameters(), RULES, default_period=16)
    w = net.emb.weight
    s0, s1 = comps[0].pieces[0].view, comps[1].pieces[0].view
    assert s0.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert s0.data_ptr() == w.data_ptr()
    assert s1.data_ptr() == w.data_ptr() + 3 * 3 * w.element_size()
    comps[1].scatter(torch.arange(6, dtype=torch.float32))
    assert torch.equal(w.data[3:5], torch.arange(6, dtype=torch.float32).view(2, 3))
    before = w.data[0:3].clone()
    comps[0].gather()
    assert torch.equal(w.data[0:3], before)  # gather does not write the model
    # writing the model is seen through the view
    with torch.no_grad():
        w[0, 0] = 123.0
    assert comps[0].gather()[0].item() == 123.0


def test_gather_scatter_round_trip():
    net = Net()
    comps = split_components(net.named_parameters(), RULES, default_period=16)
    rest = comps[3]
    flat = rest.gather()
    expected = torch.cat([net.lin.weight.reshape(-1), net.lin.bias, net.bn.weight, net.bn.bias]).detach()
    assert torch.equal(flat, expected)
    assert flat is rest.flat
    ptr = rest.flat.data_ptr()
    new = torch.linspace(-1, 1, rest.numel)
    rest.scatter(new)
    assert torch.equal(net.lin.weight.data, new[:6].view(2, 3))
    assert torch.equal(net.lin.bias.data, new[6:8])
    assert torch.equal(net.bn.weight.data, new[8:10])
    assert torch.equal(net.bn.bias.data, new[10:12])
    assert torch.equal(rest.gather(), new)
    assert rest.flat.data_ptr() == ptr  # the work buffer is reused, never reallocated
    # scatter() without an argument writes the flat buffer back
    rest.flat.mul_(2.0)
    rest.scatter()
    assert torch.equal(net.lin.bias.data, 2 * new[6:8])
    # the other components were not touched
    head = comps[2].gather().clone()
    rest.scatter(torch.zeros(rest.numel))
    assert torch.equal(comps[2].gather(), head)


def test_flat_buffer_dtype_and_sizes():
    net = Net()
    comps = split_components(net.named_parameters(), RULES, default_period=16)
    for c in comps:
        assert c.flat.dtype == torch.float32
        assert c.flat.dim() == 1
        assert c.nbytes == 4 * c.numel
    comps64 = split_components(net.named_parameters(), RULES, 16, flat_dtype=torch.float64)
    assert comps64[0].flat.dtype == torch.float64 and comps64[0].nbytes == 8 * comps64[0].numel


def test_frozen_parameters_are_excluded():
    net = Net()
    net.lin.bias.requires_grad_(False)
    net.emb.weight.requires_grad_(False)
    rules = [ComponentRule(name="head", pattern=r"^head\."), ComponentRule(name="rest")]
    comps = split_components(net.named_parameters(), rules, default_period=16)
    all_names = [n for c in comps for n in names(c)]
    assert "lin.bias" not in all_names and "emb.weight" not in all_names
    assert names(comps[1]) == ["lin.weight", "bn.weight", "bn.bias"]


def test_frozen_parameter_needs_no_rule():
    net = Net()
    net.emb.weight.requires_grad_(False)
    rules = [ComponentRule(name="lin", pattern=r"^lin\."), ComponentRule(name="bn", pattern=r"^bn\."),
             ComponentRule(name="head", pattern=r"^head\.")]
    comps = split_components(net.named_parameters(), rules, default_period=16)  # no error for emb.weight
    assert [c.name for c in comps] == ["lin", "bn", "head"]


def test_pattern_matching_only_frozen_parameters_is_an_error():
    net = Net()
    net.emb.weight.requires_grad_(False)
    with pytest.raises(ConfigError, match="emb"):
        split_components(net.named_parameters(), RULES, default_period=16)


# -- errors ------------------------------------------------------------------------------------
def test_parameter_matching_two_patterns_is_an_error():
    net = Net()
    rules = [ComponentRule(name="weights", pattern="weight"), ComponentRule(name="lin", pattern=r"^lin\."),
             ComponentRule(name="rest")]
    with pytest.raises(ConfigError) as e:
        split_components(net.named_parameters(), rules, default_period=16)
    msg = str(e.value)
    assert "lin.weight" in msg and "weights" in msg and "lin" in msg


def test_parameter_matching_no_rule_without_catch_all_is_an_error():
    net = Net()
    rules = [ComponentRule(name="emb", pattern=r"^emb\."), ComponentRule(name="head", pattern=r"^head\.")]
    with pytest.raises(ConfigError, match=r"lin\.weight"):
        split_components(net.named_parameters(), rules, default_period=16)


def test_pattern_that_matches_nothing_is_an_error():
    net = Net()
    rules = [ComponentRule(name="typo", pattern=r"^embedding\."), ComponentRule(name="rest")]
    with pytest.raises(ConfigError) as e:
        split_components(net.named_parameters(), rules, default_period=16)
    assert "typo" in str(e.value) and "^embedding" in str(e.value)


def test_more_shards_than_rows_is_an_error():
    net = Net()
    rules = [ComponentRule(name="emb", pattern=r"^emb\.", shards=6), ComponentRule(name="rest")]
    with pytest.raises(ConfigError) as e:
        split_components(net.named_parameters(), rules, default_period=16)
    msg = str(e.value)
    assert "emb.weight" in msg and "6" in msg and "(5, 3)" in msg


def test_sharding_a_scalar_parameter_is_an_error():
    class Scalar(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.tensor(1.0))

    with pytest.raises(ConfigError, match=r"'s'"):
        split_components(Scalar().named_parameters(), [ComponentRule(name="x", shards=2)], default_period=1)


def test_invalid_regex_is_an_error():
    net = Net()
    rules = [ComponentRule(name="bad", pattern="emb(["), ComponentRule(name="rest")]
    with pytest.raises(ConfigError) as e:
        split_components(net.named_parameters(), rules, default_period=16)
    assert "bad" in str(e.value) and "emb([" in str(e.value)


def test_two_catch_all_rules_are_an_error():
    net = Net()
    with pytest.raises(ConfigError, match="rest2"):
        split_components(net.named_parameters(), [ComponentRule(name="rest"), ComponentRule(name="rest2")], 16)


def test_model_without_trainable_parameters_is_an_error():
    net = Net()
    for p in net.parameters():
        p.requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable"):
        split_components(net.named_parameters(), [ComponentRule()], 16)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# -- buffers -------------------------------------------------------------------------------------
def test_split_buffers_takes_float_buffers_only():
    net = Net()
    b = split_buffers(net.named_buffers(), period=4)
    assert b is not None
    assert b.name == "buffers" and b.index == -1 and b.period == 4
    assert names(b) == ["bn.running_mean", "bn.running_var"]  # not bn.num_batches_tracked
    assert b.numel == 4
    # the pieces are the live buffers: scatter writes BatchNorm's statistics
    b.scatter(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(net.bn.running_mean, torch.tensor([1.0, 2.0]))
    assert torch.equal(net.bn.running_var, torch.tensor([3.0, 4.0]))
    assert torch.equal(b.gather(), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert net.bn.num_batches_tracked.dtype == torch.long


def test_split_buffers_none_without_float_buffers():
    assert split_buffers(nn.Linear(2, 2).named_buffers(), 4) is None
    only_int = [("count", torch.zeros(3, dtype=torch.long)), ("none", None)]
    assert split_buffers(only_int, 4) is None


# --- per_match: one component per value of the pattern's capture group --------------------------

def test_per_match_makes_one_component_per_captured_value():
    from gossip_accel.models.lstm_lm import LSTMPLanguageModel

    model = LSTMPLanguageModel(300, [100, 200], 8, 16, 4)
    rules = [ComponentRule(name="tail", pattern=r"^softmax\.tail\.(\d+)\.", per_match=True),
             ComponentRule(name="rest")]
    comps = split_components(model.named_parameters(), rules, default_period=4)
    assert [c.name for c in comps] == ["tail.0", "tail.1", "rest"]
    assert [p.name for p in comps[1].pieces] == ["softmax.tail.1.0.weight", "softmax.tail.1.1.weight"]


def test_per_match_without_capture_group_is_an_error():
    model = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="capture group"):
        split_components(model.named_parameters(), [ComponentRule(name="w", pattern="weight", per_match=True),
                                                    ComponentRule(name="rest")], default_period=4)
