"""Link specifications: ``RATE/DELAY`` strings, the named presets, and tc's arguments for them.

A link spec is a per-worker full-duplex link: ``RATE`` limits what a worker sends and what it
receives, each at that rate (a non-blocking switch behind it); ``DELAY`` is the one-way
latency added to every packet a worker sends, so a round trip between two workers costs
2 * DELAY plus the transfer time. ``RATE`` is tc's notation (``10gbit``, ``100mbit``, ``500kbit``)
or ``unlimited``; ``DELAY`` is ``0.1ms``, ``20ms``, ``1s`` or ``0``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

PRESETS = {  # name -> spec: a rack, a slow cluster, two sites (the examples)
    "rack": "10gbit/0.1ms",
    "slow": "1gbit/1ms",
    "cross-site": "100mbit/20ms",
}
# rack is not in the default: a Python delay forwarder cannot give 10 Gbit/s and 0.1 ms (bench/README.md)
DEFAULT_PRESETS = ("slow", "cross-site")

_RATE_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_TIME_UNITS = {"": 1e-3, "ms": 1e-3, "us": 1e-6, "s": 1.0}


class LinkSpecError(ValueError):
    """A link spec that cannot be parsed; the message says what was expected."""


@dataclass(frozen=True)
class LinkSpec:
    """Rate in bits/s (None = unlimited) and one-way delay in seconds."""

    rate_bps: Optional[float]
    delay_s: float
    name: str = ""

    @property
    def label(self) -> str:
        """``name (spec)`` for presets, the spec otherwise."""
        return f"{self.name} ({self.spec})" if self.name else self.spec

    @property
    def spec(self) -> str:
        return f"{format_rate(self.rate_bps)}/{format_delay(self.delay_s)}"

    @property
    def rtt_s(self) -> float:
        """The round-trip time the spec asks for, without transfer time."""
        return 2.0 * self.delay_s

    def as_dict(self) -> dict:
        return {"name": self.name, "spec": self.spec, "rate_bps": self.rate_bps, "delay_s": self.delay_s,
                "asked_rtt_ms": self.rtt_s * 1e3}


def parse_rate(text: str) -> Optional[float]:
    """``10gbit`` -> 1e10 bits/s; ``unlimited`` / ``none`` -> None."""
    t = text.strip().lower()
    if t in ("unlimited", "none", "inf"):
        return None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([kmgt]?bit)?", t)
    if not m:
        raise LinkSpecError(f"rate {text!r}: expected a number with kbit/mbit/gbit (e.g. 1gbit, 100mbit) or 'unlimited'")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2) or ""]
    if value <= 0:
        raise LinkSpecError(f"rate {text!r} must be positive")
    return value


def parse_delay(text: str) -> float:
    """``0.1ms`` -> 1e-4 s; a bare number is milliseconds."""
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(ms|us|s)?", text.strip().lower())
    if not m:
        raise LinkSpecError(f"delay {text!r}: expected e.g. 0.1ms, 20ms, 500us or 0")
    return float(m.group(1)) * _TIME_UNITS[m.group(2) or ""]


def parse_link(text: str) -> LinkSpec:
    """A preset name (``rack``, ``slow``, ``cross-site``) or ``RATE/DELAY``."""
    t = text.strip()
    if t in PRESETS:
        spec = parse_link(PRESETS[t])
        return LinkSpec(spec.rate_bps, spec.delay_s, t)
    parts = t.split("/")
    if len(parts) != 2:
        raise LinkSpecError(f"link {text!r}: expected RATE/DELAY (e.g. 1gbit/1ms) or one of {', '.join(PRESETS)}")
    return LinkSpec(parse_rate(parts[0]), parse_delay(parts[1]))


def format_rate(bps: Optional[float]) -> str:
    if bps is None:
        return "unlimited"
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def format_delay(seconds: float) -> str:
    return "0ms" if seconds == 0 else f"{seconds * 1e3:g}ms"


def tbf_args(rate_bps: float, mtu: int) -> list[str]:
    """``tc qdisc ... tbf`` arguments for a rate: burst of at least two MTU-sized packets (tbf
    never sends a packet larger than its bucket) or 1 ms of the rate, and a queue of 10 ms of
    the rate (at least 1 MB), like a switch port buffer."""
    rate_bytes = rate_bps / 8.0
    burst = int(max(2 * mtu + 1024, rate_bytes * 1e-3))
    limit = int(max(1 << 20, rate_bytes * 10e-3, 2 * burst))
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "limit", str(limit)]
