"""sync.exchange_dtype: components travel in bf16/fp16, the average and the update rule stay fp32.

Real gloo workers (tests/group_runs.py, shared with test_hierarchical.py) against the simulator,
which rounds at the same places (gossip_accel/sync/precision.py); the byte counters halve; and the
difference from the fp32 exchange stays bounded (one sync: the rounding bound; 64 steps of
training on the toy task: measured, with a margin).
"""
from __future__ import annotations

import math

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.precision import simulated_full_mean, wire_round
from gossip_accel.sync.simulate import SimulatedCluster
from group_runs import BASE, SCENARIOS, assert_matches_simulator, largest_difference, run
from harness import DATA_SEED, initial_model, make_optimizer, model_state

FLAT_LOWP = ["ma_bf16", "bmuf_fp16_warmup", "gossip_bmuf_bf16"]
#: unit roundoff (half an ulp at 1.0) of the wire dtypes
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


@pytest.mark.parametrize("name", FLAT_LOWP)
def test_low_precision_exchange_matches_simulator(name):
    assert_matches_simulator(name)


def test_low_precision_really_rounds():
    """The bf16 run is not the fp32 run (the rounding is modelled, not skipped)."""
    assert largest_difference("ma_bf16", "ma_fp32") > 1e-5


def test_gossip_bytes_halve():
    """Neighbour exchange: exactly half the bytes of fp32, component by component."""
    lowp, fp32 = run("gossip_bmuf_bf16"), run("gossip_bmuf_fp32")
    for rank in range(len(lowp)):
        a, b = lowp[rank]["metrics"], fp32[rank]["metrics"]
        for comp in lowp[rank]["components"]:
            for way in ("sent", "recv"):
                key = f"sync/bytes_{way}/{comp}"
                assert b[key] > 0 and a[key] == b[key] / 2, (rank, key)


def test_allreduce_bytes_halve():
    """All-reduce: reduce-scatter + all-gather of ceil(numel / n) wire elements per rank and chunk,
    2 (n-1) chunks each way, against the ring model 2 (n-1)/n * numel * 4 of fp32."""
    lowp, fp32 = run("ma_bf16"), run("ma_fp32")
    n = len(lowp)
    steps = SCENARIOS["ma_bf16"][2]
    for rank in range(n):
        for comp, (_, nbytes, period) in lowp[rank]["components"].items():
            syncs = steps // period
            numel = nbytes // 4
            got = lowp[rank]["metrics"][f"sync/bytes_sent/{comp}"]
            assert got == syncs * 2 * (n - 1) * math.ceil(numel / n) * 2
            assert got / fp32[rank]["metrics"][f"sync/bytes_sent/{comp}"] == pytest.approx(0.5, rel=0.01)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_average_is_within_the_rounding_bound(dtype):
    """|r(sum_k r(x_k) / n) - mean_k x_k| <= u (mean_k |x_k| + |theta_bar|): two roundings, fp32 sum."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4096, generator=g) * 3 for _ in range(4)]
    exact = torch.stack(xs).mean(0)
    bar = simulated_full_mean(xs, dtype)
    assert torch.equal(bar, wire_round(bar, dtype)), "the average travels in the wire dtype"
    bound = UNIT[dtype] * (torch.stack(xs).abs().mean(0) + bar.abs()) * 1.001 + 1e-30
    assert ((bar - exact).abs() <= bound).all()
    assert (bar - exact).abs().max() > 0


def train_sim(overrides: list[str], steps: int = 64, n: int = 4) -> torch.nn.Module:
    models = [initial_model(k) for k in range(n)]
    cluster = SimulatedCluster(models, BASE, overrides)
    opts = [make_optimizer(m) for m in models]
    for t in range(1, steps + 1):
        for k in range(n):
            toy.train_step(models[k], opts[k], DATA_SEED, k, t)
        cluster.step()
    cluster.finalize()
    return models[0]


# measured after 64 steps (docs/ALGORITHMS.md): relative distance <= 0.04 (bf16) and 0.0035 (fp16),
# held-out MSE within 0.15 %; the bounds leave a margin of 2.5x or more
BOUND = {"bfloat16": (0.1, 0.01), "float16": (0.01, 0.005)}


@pytest.mark.parametrize("algo", [["sync.algorithm=ma"], ["sync.algorithm=bmuf"],
                                  ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1"]],
                         ids=["ma", "bmuf", "gossip_bmuf"])
@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
def test_difference_from_fp32_exchange_is_bounded(algo, wire):
    ref = model_state(train_sim(algo))
    low_model = train_sim([*algo, f"sync.exchange_dtype={wire}"])
    low = model_state(low_model)
    rel_bound, loss_bound = BOUND[wire]
    for k, v in ref.items():
        if v.is_floating_point():
            rel = float((low[k] - v).norm() / v.norm())
            assert rel <= rel_bound, f"{k}: relative distance {rel:.3g} from the fp32 exchange"
    ref_model = initial_model(0)
    ref_model.load_state_dict(ref)
    assert toy.heldout_loss(low_model) == pytest.approx(toy.heldout_loss(ref_model), rel=loss_bound)


@pytest.mark.parametrize("algo", ["easgd", "easgd_async", "asgd", "adpsgd_fixed", "adpsgd_random", "adpsgd_delay"])
def test_server_and_pairwise_algorithms_refuse_a_low_precision_wire(algo):
    with pytest.raises(ConfigError, match="set sync.exchange_dtype=float32"):
        load_sync_config(BASE, [f"sync.algorithm={algo}", "sync.exchange_dtype=bfloat16"])


def test_unknown_exchange_dtype():
    with pytest.raises(ConfigError, match="sync.exchange_dtype='int2'; choose one of float32, bfloat16, float16, int8, int4"):
        load_sync_config(BASE, ["sync.exchange_dtype=int2"])
