"""The synchronizer's tensor code on a CUDA device: what a GPU cluster runs, checked against the CPU.

Skipped without a GPU (CI has none; run on a GPU machine: ``python -m pytest tests/test_cuda.py``).
Multi-rank runs need one GPU per rank (NCCL refuses two ranks on one device), so what is checked on a
single GPU is the per-worker code every engine and the simulator share:

* the int8/int4 coder (quantize.py) gives the same payload bytes, decoded values, public copies and residuals
  on the GPU as on the CPU, bit for bit, on values spanning the fp32 range with subnormals, +-inf and NaN
  (so a CPU simulator is the oracle of a GPU run's rounding);
* the simulator of n workers, its models and slots on the GPU, follows the same trajectory as on the CPU
  (fp32 and bf16 wires, int4 with stagger and overlap, int8 BMUF with its slots on the CPU): the update rules,
  the ring means, the overlap merge and the wire rounding run there on CUDA tensors.
"""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.quantize import apply_to_copy_, compress_, send_to_copy_
from gossip_accel.sync.simulate import SimulatedCluster
from test_quantized_exchange import CODECS, IDS, battery

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal values (NaN where NaN), compared on the CPU."""
    a, b = a.cpu(), b.cpu()
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@pytest.mark.parametrize("length", [9, 97, 1000, 70_001])
def test_coder_on_cuda_is_bit_identical_to_cpu(codec, length):
    x = battery(3, length, length + codec.block)
    payload = codec.encode(x)
    assert torch.equal(codec.encode(x.cuda()).cpu(), payload)
    assert same(codec.decode(payload.cuda(), length), codec.decode(payload, length))
    smooth = torch.randn(2, length, generator=torch.Generator().manual_seed(length)) * 0.1
    residual = torch.randn(2, length, generator=torch.Generator().manual_seed(1)) * 1e-3
    r_gpu = residual.cuda()
    assert torch.equal(compress_(codec, smooth.cuda(), r_gpu).cpu(), compress_(codec, smooth, residual))
    assert same(r_gpu, residual)
    theta, copy = smooth[0], smooth[1].clone()
    copy_gpu, recv_gpu, recv = copy.cuda(), copy.cuda(), copy.clone()
    sent = send_to_copy_(codec, theta, copy)
    assert torch.equal(send_to_copy_(codec, theta.cuda(), copy_gpu).cpu(), sent)
    assert same(copy_gpu, copy)
    assert same(apply_to_copy_(codec, recv_gpu, sent.cuda().reshape(1, -1)), apply_to_copy_(codec, recv, sent.reshape(1, -1)))


SETTINGS = {
    "gossip_bmuf": ["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.block_momentum=0.9"],
    "gossip_bmuf_bf16_stagger_overlap": ["sync.algorithm=gossip_bmuf", "sync.exchange_dtype=bfloat16",
                                         "sync.stagger=true", "sync.overlap_steps=2"],
    "gossip_bmuf_int4_stagger_overlap": ["sync.algorithm=gossip_bmuf", "sync.exchange_dtype=int4",
                                         "sync.broadcast_initial=true", "sync.stagger=true", "sync.overlap_steps=2"],
    "bmuf_int8_slots_cpu": ["sync.algorithm=bmuf", "sync.exchange_dtype=int8", "sync.broadcast_initial=true",
                            "sync.slots_on_cpu=true"],
    "ma": ["sync.algorithm=ma"],
}


def simulate_on(device: str, overrides: list[str], n: int = 4, steps: int = 24) -> list[dict[str, torch.Tensor]]:
    """n toy replicas on ``device``, synchronized by the simulator; each local step adds worker k's step-t noise
    (drawn on the CPU, the same bits on either device), so every difference between devices comes from the
    synchronization's own arithmetic. The final states (after the final average), on the CPU."""
    models = [toy.ToyModel(seed=k).to(device) for k in range(n)]
    cluster = SimulatedCluster(models, {"components": toy.TOY_COMPONENTS, "period": 4}, overrides)
    for t in range(1, steps + 1):
        for k, m in enumerate(models):
            g = torch.Generator().manual_seed(1000 * t + k)
            with torch.no_grad():
                for p in m.parameters():
                    p.add_((torch.randn(p.shape, generator=g) * 0.01).to(device))
        cluster.step()
    cluster.finalize()
    return [{k: v.detach().cpu() for k, v in m.state_dict().items()} for m in models]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_simulator_on_cuda_follows_the_cpu(name):
    """The same local steps on both devices: the ring's means, the update rules, the overlap merge and the wire
    rounding are elementwise and give the same bits; a full-graph mean is a CUDA reduction, whose order of
    addition may differ from the CPU's in the last bit (MA's fp32 mean)."""
    cpu, gpu = simulate_on("cpu", SETTINGS[name]), simulate_on("cuda", SETTINGS[name])
    for k, (a, b) in enumerate(zip(cpu, gpu)):
        for key in a:
            if name == "ma" and a[key].is_floating_point():
                assert torch.allclose(a[key], b[key], rtol=1e-6, atol=1e-7), f"{name} replica {k} {key}"
            else:
                assert same(a[key], b[key]), f"{name} replica {k} {key}"
