"""Split a model's trainable parameters into named components theta_i with periods H_i.

Section 2.2 of 000_07fa007f7f1023ae.txt: theta = [theta_1^T, ..., theta_m^T]^T, each
component synchronized with its own period and its own random neighbours. Section 3.2
splits the embedding into 8 row shards, the LSTM, the projection, the softmax head and each
softmax tail into their own groups; :class:`~gossip_accel.sync.config.ComponentRule` expresses that.

A component is a list of tensor views (whole parameters or row slices of them) plus a flat
work buffer it is gathered into for communication, so every sync moves one contiguous
buffer per component and never issues a per-parameter collective.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from .config import ComponentRule, ConfigError


@dataclass
class Piece:
    """A view on (part of) one parameter: ``param_name[rows]``."""

    name: str
    view: torch.Tensor


@dataclass
class Component:
    """theta_i: named, with period H_i, a list of pieces and a reusable flat buffer."""

    index: int
    name: str
    period: int
    pieces: list[Piece]
    flat: torch.Tensor = field(repr=False)
    offset: int = 0  # o_i of sync.stagger (schedule.stagger_offsets): syncs when (t - W + o_i) mod H_i == 0

    @property
    def numel(self) -> int:
        return self.flat.numel()

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def gather(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Copy the live parameters into ``flat`` (or ``out``, a tensor like it; no allocation) and return it."""
        dst = self.flat if out is None else out
        off = 0
        for piece in self.pieces:
            n = piece.view.numel()
            dst[off:off + n].copy_(piece.view.reshape(-1))
            off += n
        return dst

    def scatter(self, source: torch.Tensor | None = None) -> None:
        """Write ``source`` (default: ``flat``) back into the live parameters."""
        src = self.flat if source is None else source
        off = 0
        with torch.no_grad():
            for piece in self.pieces:
                n = piece.view.numel()
                piece.view.copy_(src[off:off + n].view_as(piece.view))
                off += n


def _match(name: str, rules: Sequence[ComponentRule]) -> int:
    explicit = [i for i, r in enumerate(rules) if r.pattern is not None and re.search(r.pattern, name)]
    if len(explicit) > 1:
        which = ", ".join(f"{rules[i].name!r} (pattern {rules[i].pattern!r})" for i in explicit)
        raise ConfigError(
            f"parameter {name!r} matches several sync.components: {which}; "
            "make the patterns disjoint so each parameter has exactly one component"
        )
    if explicit:
        return explicit[0]
    rest = [i for i, r in enumerate(rules) if r.pattern is None]
    if rest:
        return rest[0]
    raise ConfigError(
        f"parameter {name!r} matches no sync.components pattern; add a rule for it or a "
        "catch-all rule without a pattern, e.g. {name: rest}"
    )


def _group_of(name: str, rule: ComponentRule) -> str:
    """With ``per_match``, the value of the pattern's first capture group; else one group."""
    if not rule.per_match:
        return ""
    m = re.search(rule.pattern, name)
    return m.group(1)


def split_components(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    rules: Sequence[ComponentRule],
    default_period: int,
    flat_dtype: torch.dtype = torch.float32,
) -> list[Component]:
    """Assign every trainable parameter to exactly one component.

    Rules are matched with ``re.search`` on the parameter name; a rule with ``per_match``
    makes one component per distinct value of its pattern's first capture group (named
    ``<name>.<value>``: e.g. each adaptive-softmax tail its own component); a rule with
    ``pattern: null`` takes the parameters that no other rule matches. A parameter matched
    by no rule or by two explicit rules is an error naming it. Components keep the order of
    the rules, then the order of the shards; parameters keep the model's order. Components
    that end up empty are dropped (a rule that matched nothing is an error, because it is
    almost always a typo in the pattern).
    """
    rest_rules = [r.name for r in rules if r.pattern is None]
    if len(rest_rules) > 1:
        raise ConfigError(f"only one sync.components rule may omit its pattern, got {rest_rules}")
    for r in rules:
        if r.pattern is not None:
            try:
                compiled = re.compile(r.pattern)
            except re.error as e:
                raise ConfigError(f"sync.components {r.name!r}: bad regex {r.pattern!r}: {e}") from e
            if r.per_match and compiled.groups < 1:
                raise ConfigError(
                    f"sync.components {r.name!r}: per_match needs a capture group in the pattern, "
                    f"e.g. '^softmax\\.tail\\.(\\d+)\\.'; got {r.pattern!r}"
                )
        elif r.per_match:
            raise ConfigError(f"sync.components {r.name!r}: per_match needs a pattern with a capture group")

    # (rule index) -> (group value) -> shard j -> pieces; dicts keep first-seen (model) order
    buckets: list[dict[str, list[list[Piece]]]] = [{} for _ in rules]
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        ri = _match(name, rules)
        rule = rules[ri]
        group = _group_of(name, rule)
        shards = buckets[ri].setdefault(group, [[] for _ in range(rule.shards)])
        if rule.shards == 1:
            shards[0].append(Piece(name, param.data))
            continue
        if param.dim() == 0 or param.shape[0] < rule.shards:
            raise ConfigError(
                f"sync.components {rule.name!r} asks for {rule.shards} row shards but parameter "
                f"{name!r} has shape {tuple(param.shape)}; lower shards or exclude it from the pattern"
            )
        for j, rows in enumerate(torch.tensor_split(torch.arange(param.shape[0]), rule.shards)):
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            shards[j].append(Piece(f"{name}[{lo}:{hi}]", param.data[lo:hi]))

    components: list[Component] = []
    for rule, groups in zip(rules, buckets):
        if rule.pattern is not None and not groups:
            raise ConfigError(
                f"sync.components {rule.name!r}: pattern {rule.pattern!r} matches no trainable parameter"
            )
        for group, shards in groups.items():
            base = rule.name if not rule.per_match else f"{rule.name}.{group}"
            for j, pieces in enumerate(shards):
                devices = {p.view.device for p in pieces}
                if len(devices) > 1:
                    raise ConfigError(f"component {base!r} spans devices {devices}; keep a replica on one device")
                numel = sum(p.view.numel() for p in pieces)
                flat = torch.zeros(numel, dtype=flat_dtype, device=pieces[0].view.device)
                name = base if rule.shards == 1 else f"{base}.shard{j}"
                components.append(Component(len(components), name, rule.period or default_period, pieces, flat))
    if not components:
        raise ConfigError("the model has no trainable parameters to synchronize")
    return components


def split_buffers(named_buffers: Iterable[tuple[str, torch.Tensor]], period: int) -> Component | None:
    """Floating-point buffers (e.g. BatchNorm running statistics) as one pseudo-component.

    Integer buffers (``num_batches_tracked``) stay local: every worker counts the same.
    """
    pieces = [Piece(n, b) for n, b in named_buffers if b is not None and b.is_floating_point()]
    if not pieces:
        return None
    numel = sum(p.view.numel() for p in pieces)
    flat = torch.zeros(numel, dtype=torch.float32, device=pieces[0].view.device)
    return Component(-1, "buffers", period, pieces, flat)
