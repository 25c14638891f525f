"""The dtype of the wire (``sync.exchange_dtype``): components travel in bf16/fp16, arithmetic stays fp32.

(``int8`` / ``int4``: the outer gradients travel quantized, :mod:`gossip_accel.sync.quantize`; the
arithmetic dtype of those runs is fp32, :func:`wire_dtype`.)

Shared by the transport (:mod:`gossip_accel.sync.comm`) and the oracle (:mod:`gossip_accel.sync.simulate`),
so a distributed run and the simulator round at exactly the same places:

* a worker's component theta_i^k (fp32) is rounded once to the wire dtype when it is sent:
  ``r(theta) = fp32(wire(theta))`` (the conversion back to fp32 is exact);
* the full-graph average (Algorithm 1 line 8 with all n workers; eq. 1 of 001) is
  ``theta_bar = r( (sum_{k=0..n-1} r(theta^k)) / n )``: the sum is taken in fp32, in rank
  order, by the rank that owns a chunk of the buffer (a reduce-scatter over ``all_to_all``),
  and the mean is rounded once more for the all-gather that spreads it (:func:`wire_mean`);
* on the ring (line 8 with q neighbours) the node's own copy stays fp32 and only the received
  ones are rounded: ``theta_bar^k = (theta^k + sum_j r(theta^{k_j})) / (q + 1)``;
* the update rule (lines 9-16: the BMUF slots omega, Delta and G) is computed in fp32 on
  theta_bar, as without low precision.
"""
from __future__ import annotations

from typing import Sequence

import torch

#: ``sync.exchange_dtype`` values and their torch dtypes
WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def wire_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``sync.exchange_dtype`` value (validated in config.py); fp32 for the quantized
    wires (int8, int4), whose codes and scales quantize.py makes and reads."""
    return WIRE_DTYPES.get(name, torch.float32)


def is_low(dtype: torch.dtype) -> bool:
    """True when components are rounded for the wire (anything but fp32)."""
    return dtype != torch.float32


def wire_round(theta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """r(theta): ``theta`` as it arrives at a receiver, back in fp32 (a new tensor)."""
    return theta.to(dtype).to(torch.float32)


def wire_sum_mean(parts: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """out <- (sum_k parts[k]) / n in fp32, summed in the order given (rank order).

    ``parts`` are the wire-dtype (or already rounded fp32) copies of the n workers; ``out`` is
    an fp32 tensor of their shape. The fixed order makes the result bitwise reproducible, so the
    simulator computes exactly what the chunk owner of the distributed all-reduce computes.
    """
    out.copy_(parts[0])
    for p in parts[1:]:
        out.add_(p)
    return out.div_(len(parts))


def simulated_full_mean(thetas: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """theta_bar of a wire-dtype all-reduce of ``thetas`` (fp32, one per worker): r(sum_k r(theta^k) / n)."""
    mean = wire_sum_mean([t.to(dtype) for t in thetas], torch.empty_like(thetas[0], dtype=torch.float32))
    return wire_round(mean, dtype)
