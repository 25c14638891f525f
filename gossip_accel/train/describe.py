"""What a run's synchronization is, in the words of docs/ALGORITHMS.md: the per-run log line and
``results.json``'s ``sync_settings``."""
from __future__ import annotations

from typing import Any, Optional

from ..sync.config import SyncConfig


def periods_label(sync_cfg: SyncConfig) -> str:
    """The paper's notation of the sync periods, e.g. ``(16,128)``."""
    periods = {r.period or sync_cfg.period for r in sync_cfg.components}
    return "(" + ",".join(str(p) for p in sorted(periods)) + ")"


def sync_settings(sync: Optional[Any], world: int) -> dict[str, Any]:
    """The settings that decide what a run's synchronization does, resolved for its n replicas.

    ``sync``: the run's synchronizer (None: DDP's gradient all-reduce, or a single worker).
    eta is the block momentum actually used (``SyncConfig.resolved_block_momentum(n)``, the eq. 6
    rule of 001 when ``sync.block_momentum`` is null), p and q the ring's degree and neighbours
    (``resolved_p``/``resolved_q``); keys that do not apply to the algorithm are None.
    """
    if sync is None:
        return {"algorithm": "ddp" if world > 1 else "single", "workers": world}
    cfg: SyncConfig = sync.cfg
    n = sync.world_size  # the replicas taking part (the groups of a hierarchical run)
    ring = cfg.graph == "ring"
    return {
        "algorithm": cfg.algorithm, "workers": world, "replicas": n,
        "eta": cfg.resolved_block_momentum(n) if cfg.uses_bmuf else None,
        "zeta": cfg.block_lr if cfg.uses_bmuf else None,
        "nesterov": cfg.nesterov if cfg.uses_bmuf else None,
        "p": cfg.resolved_p(n) if ring else None, "q": cfg.resolved_q(n) if ring else None,
        "periods": periods_label(cfg), "warmup_steps": cfg.warmup_steps, "warmup_period": cfg.warmup_period,
        "wire": cfg.exchange_dtype, "warmup_kind": cfg.warmup_kind, "inner_state": cfg.inner_state,
    }


def settings_line(settings: dict[str, Any]) -> str:
    """One line for the log, e.g. ``gossip_bmuf eta=0.75 zeta=1 (NBM) p=1 q=1 periods (16,128),
    warm-up 0 steps (period 1), wire float32``."""
    algo = settings["algorithm"]
    if algo == "ddp":
        return f"ddp: gradient all-reduce every step over {settings['workers']} workers, no model sync"
    if algo == "single":
        return "single worker: no communication"
    parts = [algo]
    if settings["eta"] is not None:
        parts.append(f"eta={settings['eta']:g} zeta={settings['zeta']:g} ({'NBM' if settings['nesterov'] else 'CBM'})")
    if settings["p"] is not None:
        parts.append(f"p={settings['p']} q={settings['q']}")
    kind = settings.get("warmup_kind", "average")
    warmup = f"period {settings['warmup_period']}" if kind == "average" else f"{kind}, period {settings['warmup_period']}"
    state = settings.get("inner_state", "keep")
    return (" ".join(parts) + f", periods {settings['periods']}, warm-up {settings['warmup_steps']} steps "
            f"({warmup}), wire {settings['wire']}, {settings['replicas']} replicas"
            + (f", inner optimizer state: {state}" if state != "keep" else ""))
