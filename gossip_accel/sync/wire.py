"""The wire settings a synchronizer checkpoint depends on: recorded with its state, checked on resume.

On an int8/int4 wire (``sync.exchange_dtype``, :mod:`gossip_accel.sync.quantize`) every worker keeps the
references, the error-feedback residuals and, on the ring, the public copies of CHOCO-SGD
(:mod:`gossip_accel.sync.engines.coded`); they are the quantization errors of one codec, so a state
resumes only under the same codec: ``exchange_dtype``, ``quant_block``, ``quant_scale_dtype`` and, on
the ring, ``quant_ring``. A float wire (float32, bfloat16, float16) keeps no such state: float wires
resume each other.
"""
from __future__ import annotations

from typing import Any, Optional

from .config import ConfigError
from .quantize import QUANT_BITS

#: the ``sync.*`` keys of the int8/int4 wire's state, in the order the messages name them
CODED_KEYS = ("exchange_dtype", "quant_block", "quant_scale_dtype", "quant_ring")


def wire_of(cfg: Any, ring: bool) -> dict:
    """What a checkpoint records of ``cfg``'s wire (``ring``: the gossip ring, where quant_ring counts)."""
    if cfg.exchange_dtype not in QUANT_BITS:
        return {"exchange_dtype": cfg.exchange_dtype}
    return {k: getattr(cfg, k) for k in (CODED_KEYS if ring else CODED_KEYS[:3])}


def differing_keys(saved: dict, mine: dict) -> list[str]:
    """The keys whose values differ in a way the state depends on (none between two float wires)."""
    coded = saved.get("exchange_dtype") in QUANT_BITS, mine.get("exchange_dtype") in QUANT_BITS
    if coded[0] != coded[1]:
        return ["exchange_dtype"]
    if not coded[0]:
        return []
    return [k for k in CODED_KEYS if saved.get(k) != mine.get(k)]


def check_wire(saved: Optional[dict], mine: dict) -> None:
    """Refuse a state of another wire in one line naming the keys; ``saved`` None (a checkpoint that
    predates the record) is not checked here (the engine refuses a missing or misshapen coded state)."""
    keys = [] if saved is None else differing_keys(saved, mine)
    if keys:
        def said(w: dict) -> str:
            return ", ".join(f"sync.{k}={w.get(k)}" for k in keys)

        raise ConfigError(
            f"synchronizer checkpoint was written with {said(saved)}, this run has {said(mine)} (the int8/int4 "
            "wire's residuals and public copies are part of the state): resume with the same wire, "
            "or start a new --exp-dir (or train.resume=false)")
