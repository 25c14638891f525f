"""sync.exchange_dtype int8 / int4: the quantizer, error feedback, public copies, bytes, and the real workers.

The codec (gossip_accel/sync/quantize.py) against its bounds; error feedback keeps the drift of what was
received from what was meant to be sent within one quantization step over many syncs (without it the drift
grows); real gloo workers (tests/group_runs.py) equal the simulator and count exactly the payload (codes +
scales); a trained toy model stays close to the fp32 exchange.
"""
from __future__ import annotations

import math

import pytest
import torch

from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.sync.quantize import (Codec, apply_to_copy_, chunk_length, compress_, send_to_copy_,
                                        simulated_coded_mean)
from group_runs import (BASE, OVERLAPPED, RESUMED, REWIRED, SCENARIOS, assert_matches_simulator, largest_difference,
                        rewired, run)
from harness import assert_matches_oracle, model_state
from test_exchange_dtype import train_sim

CODECS = [Codec(8, 256), Codec(4, 256), Codec(8, 64, torch.bfloat16), Codec(4, 7), Codec(4, 1)]
IDS = ["int8-256", "int4-256", "int8-64-bf16", "int4-7", "int4-1"]


def blocks_of(x: torch.Tensor, block: int) -> torch.Tensor:
    """The per-element absmax of its block (rows of ``x``)."""
    rows, length = x.shape
    nb = -(-length // block)
    padded = torch.zeros(rows, nb * block)
    padded[:, :length] = x.abs()
    return padded.view(rows, nb, block).amax(-1).repeat_interleave(block, 1)[:, :length]


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@pytest.mark.parametrize("length", [1, 255, 1000, 1025])
def test_round_trip_error_is_at_most_half_a_step(codec, length):
    """|x - D(Q(x))| <= s / 2 with s = absmax(block) / q_max (plus q_max 2^-9 s where bf16 rounds the scale)."""
    g = torch.Generator().manual_seed(length)
    x = torch.randn(3, length, generator=g) * torch.logspace(-3, 1, length).unsqueeze(0)
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.shape == (3, codec.payload_bytes(length))
    y = codec.decode(payload, length)
    step = blocks_of(x, codec.block) / codec.qmax
    slack = 1e-6 if codec.scale_dtype == torch.float32 else 2.0 ** -9 * codec.qmax
    assert ((x - y).abs() <= step * (0.5 + slack) + 1e-12).all()
    # the largest element of every block is exact up to the scale's rounding
    assert torch.allclose(y.abs().amax(), x.abs().amax(), rtol=1e-5 if codec.scale_dtype == torch.float32 else 2.0 ** -8)


def reference_codes(codec: Codec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The module docstring's quantizer element by element: (codes, scales) of each row of ``x``."""
    rows, length = x.shape
    codes = torch.zeros(rows, length, dtype=torch.int64)
    scales = torch.zeros(rows, codec.scale_count(length))
    big = torch.finfo(codec.scale_dtype).max
    for r in range(rows):
        for j in range(scales.shape[1]):
            block = x[r, j * codec.block:(j + 1) * codec.block].double()
            m = float(block.abs().max())
            s = torch.tensor(min(m / codec.qmax, big) if m == m else m).to(codec.scale_dtype).float()
            scales[r, j] = s
            for i, v in enumerate(block.tolist(), j * codec.block):
                c = 0.0 if not s > 0 or v != v else v / float(s)
                codes[r, i] = int(max(-codec.qmax, min(codec.qmax, round(c) if abs(c) != math.inf else c)))
    return codes, scales


def battery(rows: int, length: int, seed: int) -> torch.Tensor:
    """Values spanning the fp32 range in a seeded order (fp32, CPU); from 6 elements on, a NaN, +-inf and a
    subnormal among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, length, generator=g).double() * torch.logspace(-44, 38, length, dtype=torch.float64)
    x = x[:, torch.randperm(length, generator=g)].float()
    if length > 5:
        x[0, 1], x[-1, 2], x[-1, 4] = float("nan"), float("inf"), -float("inf")
        x[0, 3] = 3e-42
    return x


@pytest.mark.parametrize("codec", CODECS + [Codec(8, 1), Codec(4, 3, torch.bfloat16)],
                         ids=IDS + ["int8-1", "int4-3-bf16"])
@pytest.mark.parametrize("length", [1, 6, 9, 64, 97])
def test_codes_and_scales_are_the_quantizer_exactly(codec, length):
    """The packed payload holds exactly the docstring's codes and scales, for values spanning the fp32
    range, subnormals, +-inf and NaN (the fast path skips the clamp only where it cannot matter)."""
    x = battery(2, length, 7 * length + codec.block)
    codes, scales = reference_codes(codec, x)
    payload = codec.encode(x)
    vb = codec.value_bytes(length)
    got_scales = payload[:, vb:].reshape(-1).clone().view(codec.scale_dtype).view(2, -1).float()
    assert torch.equal(got_scales.isnan(), scales.isnan())
    assert torch.equal(got_scales.nan_to_num(0.0), scales.nan_to_num(0.0))
    if codec.bits == 8:
        got = payload[:, :vb].contiguous().view(torch.int8).long()
    else:
        nibbles = torch.stack([payload[:, :vb] & 15, payload[:, :vb] >> 4], -1).view(2, -1).long() - 8
        got = nibbles[:, :length]
        if length % 2:
            assert (nibbles[:, length] == 0).all()
    assert torch.equal(got, codes)
    decoded = codec.decode(payload, length)
    expected = codes.float() * scales.repeat_interleave(codec.block, 1)[:, :length]
    assert torch.equal(decoded.isnan(), expected.isnan())
    assert torch.equal(decoded.nan_to_num(0.0), expected.nan_to_num(0.0))
    # a sender's own D(Q(x)), taken from the codes before packing: the same payload and the same values
    payload2, own = codec.encode_decoded(x.clone())
    assert torch.equal(payload2, payload) and own.shape == decoded.shape
    assert torch.equal(own.isnan(), decoded.isnan()) and torch.equal(own.nan_to_num(0.0), decoded.nan_to_num(0.0))


def test_zero_blocks_and_exact_codes():
    codec = Codec(4, 4)
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0, 7.0, -3.0, 1.0, 0.0, 1.0]])
    y = codec.decode(codec.encode(x), 9)
    assert torch.equal(y, x)  # multiples of the scale (1.0 here) travel exactly; an all-zero block has s = 0


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    codec = Codec(4, 8)
    x = torch.tensor([[-7.0, 7.0, 0.0, 1.0, -1.0]])  # scale 1: codes -7, 7, 0, 1, -1 -> nibbles 1, 15, 8, 9, 7, (8)
    payload = codec.encode(x)
    assert payload[0, :3].tolist() == [1 | 15 << 4, 8 | 9 << 4, 7 | 8 << 4]
    assert payload[0, 3:].clone().view(torch.float32).tolist() == [1.0]
    assert codec.payload_bytes(5) == 3 + 4


@pytest.mark.parametrize("bits,block,scale,length,expected", [
    (8, 256, torch.float32, 1000, 1000 + 4 * 4), (4, 256, torch.float32, 1000, 500 + 4 * 4),
    (4, 256, torch.bfloat16, 1001, 501 + 4 * 2), (8, 64, torch.bfloat16, 64, 64 + 2)])
def test_payload_bytes_are_codes_plus_scales(bits, block, scale, length, expected):
    codec = Codec(bits, block, scale)
    assert codec.payload_bytes(length) == expected == codec.encode(torch.randn(1, length)).numel()


@pytest.mark.parametrize("codec", CODECS[:2], ids=IDS[:2])
def test_error_feedback_keeps_the_drift_within_one_step(codec):
    """sum_t D(Q(x_t + e_{t-1})) = sum_t x_t - e_T, |e_T| <= s / 2: the drift stays bounded over 500 syncs,
    while rounding without feedback drifts by a constant bias every sync (small entries of a block with a
    large one round to 0 each time)."""
    g = torch.Generator().manual_seed(0)
    length, syncs = 512, 500
    bias = torch.rand(1, length, generator=g) * 0.02
    bias[0, ::64] = 1.0  # one large element per 64: the others are below half a step
    residual = torch.zeros(1, length)
    sent = torch.zeros(1, length)
    plain = torch.zeros(1, length)
    total = torch.zeros(1, length)
    worst = 0.0
    for _ in range(syncs):
        x = bias + 0.001 * torch.randn(1, length, generator=g)
        total += x
        sent += codec.decode(compress_(codec, x, residual), length)
        plain += codec.decode(codec.encode(x), length)
        worst = max(worst, float((total - sent).abs().max()))
        assert torch.allclose(total - sent, residual, atol=1e-3)
    step = 1.1 / codec.qmax  # the largest block absmax is below 1.1
    assert worst <= step  # one quantization step, at every sync
    assert float((total - plain).abs().max()) > 50 * step  # without error feedback the drift grows with t


def test_public_copies_stay_equal_and_within_half_a_step():
    """Both ends of an edge apply the same payload to their copy (CHOCO-SGD's hat x): equal bit for bit, and
    after each message within half a step (of the difference it carried) of theta; a non-finite theta makes
    both copies non-finite alike, and both restart from 0 at the next message."""
    codec = Codec(4, 32)
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(300, generator=g)
    sender, receiver = theta.clone(), theta.clone()
    for t in range(30):
        theta = theta + 0.05 * torch.randn(300, generator=g)
        theta[5] = float("nan") if t == 10 else theta[5]
        carried = (theta - sender.nan_to_num(0.0, 0.0, 0.0)).unsqueeze(0)
        got = apply_to_copy_(codec, receiver, send_to_copy_(codec, theta, sender))
        if t == 10:
            assert not torch.isfinite(got).all() and torch.equal(sender.isnan(), got.isnan())
            theta[5] = 0.0
            continue
        assert torch.equal(sender, got)
        step = blocks_of(carried, 32)[0] / codec.qmax
        assert ((theta - got).abs() <= step * 0.5 * (1 + 1e-5) + 1e-7).all()
        if t > 13:
            assert float((theta - got).abs().max()) < 0.05  # the copy follows theta within a fraction of a change


def test_coded_mean_of_equal_workers_is_their_common_outer_gradient():
    """n workers with the same delta: the mean is Q of it (twice, with error feedback at the owner)."""
    codec, n = Codec(8, 16), 4
    delta = torch.randn(50)
    chunk = chunk_length(50, n)
    mean = simulated_coded_mean(codec, [delta] * n, [torch.zeros(n, chunk) for _ in range(n)],
                                [torch.zeros(1, chunk) for _ in range(n)], [False] * n)
    assert (mean - delta).abs().max() <= 2 * delta.abs().max() / codec.qmax
    # a sick worker sends zeros: the mean is (n - 1) / n of the others'
    sick = simulated_coded_mean(codec, [delta, delta * float("nan"), delta, delta],
                                [torch.zeros(n, chunk) for _ in range(n)], [torch.zeros(1, chunk) for _ in range(n)],
                                [False, True, False, False])
    assert torch.isfinite(sick).all() and torch.allclose(sick * n / (n - 1), mean, atol=2 * float(delta.abs().max()) / 127)


# -- real workers (tests/group_runs.py) --------------------------------------------------------------------
# with the overlapped coded ring (sync.overlap_steps=2: coded from theta_t at t, decoded at t + tau), with and
# without stagger, copies and params, a warm-up, local-BMUF and between groups (tests/group_runs.py, OVERLAPPED)
QUANTIZED = ["ma_int4", "bmuf_int8_warmup", "gossip_bmuf_int8", "gossip_bmuf_int4_params", "hier_bmuf_int8", *OVERLAPPED,
             "hier_gossip_bmuf_int4_overlap"]


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_exchange_matches_simulator(name):
    assert_matches_simulator(name)


def test_quantized_run_really_quantizes():
    assert largest_difference("ma_int4", "ma_fp32") > 1e-5


def test_allreduce_bytes_are_the_payload():
    """2 (n-1) chunk payloads per sync, chunk = ceil(numel / n), payload = ceil(chunk / 2) codes + scales."""
    q, fp32 = run("ma_int4"), run("ma_fp32")
    n, steps = len(q), SCENARIOS["ma_int4"][2]
    codec = Codec(4, 256)
    for rank in range(n):
        for comp, (_, nbytes, period) in q[rank]["components"].items():
            numel = nbytes // 4
            got = q[rank]["metrics"][f"sync/bytes_sent/{comp}"]
            assert got == (steps // period) * 2 * (n - 1) * codec.payload_bytes(chunk_length(numel, n))
            assert got < fp32[rank]["metrics"][f"sync/bytes_sent/{comp}"] / 6


@pytest.mark.parametrize("name,codec", [("gossip_bmuf_int8", Codec(8, 256)), ("gossip_bmuf_int4_params", Codec(4, 256))])
def test_gossip_bytes_are_the_payload(name, codec):
    """Same messages as the fp32 twin (copies: one per receiver; params: one payload to every receiver),
    each payload(numel) bytes instead of 4 numel."""
    q, fp32 = run(name), run("gossip_bmuf_fp32")
    for rank in range(len(q)):
        for comp, (_, nbytes, _) in q[rank]["components"].items():
            numel = nbytes // 4
            for way in ("sent", "recv"):
                key = f"sync/bytes_{way}/{comp}"
                assert fp32[rank]["metrics"][key] > 0
                assert q[rank]["metrics"][key] == fp32[rank]["metrics"][key] / nbytes * codec.payload_bytes(numel)


@pytest.mark.parametrize("name", list(OVERLAPPED))
def test_overlapped_coded_ring_sends_the_blocking_bytes(name):
    """The same coded payloads as the blocking twin (every exchange posted, the last drained by finalize), counted
    alike; the run itself is not the blocking one (the average lands tau steps later)."""
    over, blocking = run(name), run(OVERLAPPED[name])
    for rank in range(len(over)):
        keys = [k for k in blocking[rank]["metrics"] if k.startswith("sync/bytes_")]
        assert keys and blocking[rank]["metrics"]["sync/bytes_sent"] > 0
        assert {k: over[rank]["metrics"][k] for k in keys} == {k: blocking[rank]["metrics"][k] for k in keys}
        assert (over[rank]["before"]["hidden.weight"] - blocking[rank]["before"]["hidden.weight"]).abs().max() > 1e-5


@pytest.mark.parametrize("name", [n for n in RESUMED if n in OVERLAPPED])
def test_resume_with_a_coded_exchange_in_flight_is_bit_exact(name):
    """A checkpoint taken with a coded ring exchange in flight (its payloads, the senders' updated copies or
    residuals, the receivers' copies not yet updated) resumes to the uninterrupted run bit for bit."""
    for rank, (a, b) in enumerate(zip(run(f"resumed_{name}"), run(name))):
        for when in ("before", "final"):
            assert a[when].keys() == b[when].keys()
            for k in a[when]:
                assert torch.equal(a[when][k], b[when][k]), f"resumed {name} rank {rank} {when} {k}"
        assert a["metrics"]["sync/bytes_sent"] == b["metrics"]["sync/bytes_sent"]


def test_resumed_quantized_run_equals_uninterrupted():
    """The references and residuals are checkpointed with the synchronizer (the public copies of the ring:
    tests/test_distributed_equals_simulator.py, gossip_bmuf_pair_int4)."""
    for rank, (a, b) in enumerate(zip(run("resumed_hier_bmuf_int8"), run("hier_bmuf_int8"))):
        assert_matches_oracle(a, b["before"], b["final"], f"resumed rank {rank} ")


#: REWIRED (tests/group_runs.py) -> the keys the one-line refusal names, None where the resume works
REFUSALS = {("gossip_bmuf_int8", "sync.exchange_dtype=float32"): "sync.exchange_dtype=int8, this run has sync.exchange_dtype=float32",
            ("gossip_bmuf_int8", "sync.exchange_dtype=int4"): "sync.exchange_dtype=int8, this run has sync.exchange_dtype=int4",
            ("gossip_bmuf_int8", "sync.quant_block=64"): "sync.quant_block=256, this run has sync.quant_block=64",
            ("gossip_bmuf_int8", "sync.quant_ring=params"): "sync.quant_ring=copies, this run has sync.quant_ring=params",
            ("gossip_bmuf_fp32", "sync.exchange_dtype=int4"): "sync.exchange_dtype=float32, this run has sync.exchange_dtype=int4",
            ("gossip_bmuf_fp32", "sync.exchange_dtype=bfloat16"): None,  # float wires keep no wire state
            ("gossip_bmuf_int4_overlap", "sync.exchange_dtype=float32"): "sync.exchange_dtype=int4, this run has sync",
            # a checkpoint from before the wire was recorded: the engine's own checks
            ("legacy:gossip_bmuf_int8", "sync.exchange_dtype=float32"): "holds int8/int4 wire state, this run has "
                                                                         "sync.exchange_dtype=float32",
            ("legacy:gossip_bmuf_int8", "sync.quant_ring=params"): "(another sync.quant_ring, sync.warmup_steps or model)"}


def test_a_checkpoint_of_another_wire_is_refused_in_one_line_naming_the_file_and_key():
    """The int8/int4 wire's residuals and public copies are in the synchronizer state: a resume under another
    sync.exchange_dtype / quant_block / quant_ring says so (the file, the keys, both values), not a shape error."""
    for rank, said in enumerate(rewired()):
        for (source, overrides), got in zip(REWIRED, said):
            want = REFUSALS[source, overrides[0]]
            if want is None:
                assert got is None, got
                continue
            assert got is not None and "\n" not in got, (source, overrides)
            assert got.startswith("/") and f"rank{rank}.pt: synchronizer checkpoint" in got, got
            assert want in got and "resume with the same" in got, got


# measured after 64 toy steps (docs/ALGORITHMS.md): largest relative distance of a tensor from the fp32
# exchange ma 0.00056 / 0.011, bmuf 0.0019 / 0.033, gossip_bmuf (copies) 0.0052 / 0.090 (int8 / int4); the
# bounds leave a margin of 2.5x
BOUND = {("ma", "int8"): 0.0015, ("ma", "int4"): 0.03, ("bmuf", "int8"): 0.005, ("bmuf", "int4"): 0.08,
         ("gossip_bmuf", "int8"): 0.013, ("gossip_bmuf", "int4"): 0.23}


@pytest.mark.parametrize("algo", ["ma", "bmuf", "gossip_bmuf"])
@pytest.mark.parametrize("wire", ["int8", "int4"])
def test_difference_from_fp32_exchange_is_bounded(algo, wire):
    ring = ["sync.p=1", "sync.q=1"] if algo == "gossip_bmuf" else []
    ref = model_state(train_sim([f"sync.algorithm={algo}", *ring]))
    low = model_state(train_sim([f"sync.algorithm={algo}", *ring, f"sync.exchange_dtype={wire}"]))
    rels = {k: float((low[k] - v).norm() / v.norm()) for k, v in ref.items() if v.is_floating_point()}
    assert max(rels.values()) > 0, "the quantized exchange is really quantized"
    for k, rel in rels.items():
        assert rel <= BOUND[algo, wire], f"{k}: relative distance {rel:.3g} from the fp32 exchange"


@pytest.mark.parametrize("override,match", [
    ("sync.quant_block=0", "sync.quant_block=0 must be an int >= 1"),
    ("sync.quant_scale_dtype=float16", "sync.quant_scale_dtype='float16'; choose one of float32, bfloat16"),
    ("sync.quant_ring=choco", "sync.quant_ring='choco'; choose one of copies, params"),
    ("sync.broadcast_initial=false", "set sync.broadcast_initial=true")])
def test_bad_quantizer_config_is_one_line_naming_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_sync_config(BASE, ["sync.exchange_dtype=int8", override])


@pytest.mark.parametrize("algo", ["easgd", "adpsgd_fixed"])
def test_server_and_pairwise_refuse_a_quantized_wire(algo):
    with pytest.raises(ConfigError, match="set sync.exchange_dtype=float32"):
        load_sync_config(BASE, [f"sync.algorithm={algo}", "sync.exchange_dtype=int4"])
