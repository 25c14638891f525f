"""Structured configuration of the synchronizer (omegaconf).

A YAML file such as::

    sync:
      algorithm: gossip_bmuf      # ma | bmuf | local_ma | local_bmuf | gossip_ma | gossip_bmuf
                                  # | easgd | easgd_async | asgd | adpsgd_fixed | adpsgd_random | adpsgd_delay
      period: 16                  # default H_i of every component
      p: 1                        # symmetric degree of the ring (Definition 1)
      q: 1                        # gossip neighbours per round (q <= 2p; q = 2p is "local")
      block_momentum: 0.9         # eta   (Algorithm 1 line 11)
      block_lr: 1.0               # zeta  (Algorithm 1 line 11)
      nesterov: true              # NBM (line 13) or CBM
      outer_optimizer: null       # or e.g. {name: SGD, lr: 0.7, momentum: 0.9, nesterov: true} (DiLoCo)
      components:
        - {name: embedding, pattern: '^embedding\\.', period: 128, shards: 8}
        - {name: rest}                # no pattern: everything else

is loaded with :func:`load_sync_config`, which also takes dotlist overrides
(``sync.period=8``). Unknown keys and wrong types are errors that name the key.

Notation follows ``shared/papers/README.md``: eta = block momentum, zeta = block learning
rate (in 001_3db6b3ddf1f13045.txt the two letters are swapped: there eq. 4 reads
Delta_t = zeta Delta_{t-1} + eta G_t).
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import registry
from .schedule import WARMUP_KINDS

#: every value of ``sync.algorithm``, in the order of the registry (gossip_accel/sync/registry.py)
ALGORITHMS = registry.names()
BUFFER_POLICIES = ("average", "local", "broadcast")
#: what a synchronization does with a non-finite (NaN/inf) replica (gossip_accel/sync/health.py)
NONFINITE_POLICIES = ("reset", "raise", "ignore")
#: ``sync.inner_state``: what a sync does with the inner optimizer's state of the component (inner_state.py)
INNER_STATES = ("keep", "reset", "average")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or inconsistent; the message names the key."""


@dataclass
class ComponentRule:
    """Parameters whose full name matches ``pattern`` (``re.search``) form component ``name``.

    A rule without ``pattern`` takes every parameter that no other rule matches (at most one
    such rule); a parameter matched by two patterns is an error.

    ``shards > 1`` row-shards every matched parameter (dim 0) into ``shards`` contiguous
    pieces, each its own component ``name.shard{j}`` (section 3.2 of the gossip-BMUF paper
    splits the embedding into 8 shards). ``period`` overrides ``sync.period`` (H_i).
    ``per_match: true`` makes one component per distinct value of the pattern's first capture
    group, e.g. ``{name: tail, pattern: '^softmax\\.tail\\.(\\d+)\\.', per_match: true}``
    gives ``tail.0``, ``tail.1``, ... (section 3.2: each tail cluster its own group).
    """

    name: str = "all"
    pattern: Optional[str] = None
    period: Optional[int] = None
    shards: int = 1
    per_match: bool = False


#: ``sync.exchange_dtype``: the dtype components travel in (gossip_accel/sync/precision.py)
EXCHANGE_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")
#: ``sync.quant_ring`` (int8/int4 on the ring, gossip_accel/sync/engines/coded.py): per-edge public copies
#: updated by quantized differences (CHOCO-SGD), or the parameters themselves with error feedback
QUANT_RINGS = ("copies", "params")
#: ``sync.quant_scale_dtype``: the dtype of the per-block scales on the int8/int4 wire (quantize.SCALE_DTYPES)
QUANT_SCALE_DTYPES = ("float32", "bfloat16")
#: ``sync.mixing``: how a gossip round mixes (gossip_accel/topology.py): the paper's one-way pull of q
#: chosen neighbours, or a random matching of ring neighbours (both ends average; doubly stochastic)
MIXINGS = ("pull", "pair")
#: ``sync.overlap_merge``: how a delayed average is merged with the tau steps made meanwhile (overlap.py)
OVERLAP_MERGES = ("delta", "mix", "replace")
#: ``sync.hierarchy.carriers``: which local rank of a group carries component i between groups
CARRIER_POLICIES = ("balanced", "round_robin")
#: ``sync.hierarchy.group_size`` words: one group per node (``node`` insists on several nodes)
GROUP_WORDS = ("node", "auto")


def check_group_size(g: Any, world: Optional[int] = None, key: str = "sync.hierarchy.group_size",
                     groups_needed: bool = False) -> None:
    """The rule of replica groups, in one place: g (an int >= 1; 1 = flat) consecutive ranks per group,
    and for g > 1 (or always with ``groups_needed``) g divides the ``world`` processes and leaves at least
    2 groups. Raises :class:`ConfigError` naming ``key`` (a config key or the caller, e.g. ``ReplicaGroups``)."""
    if not isinstance(g, int) or isinstance(g, bool):
        raise ConfigError(f"{key}={g!r}; give null (flat), an int (ranks per group) or one of {', '.join(GROUP_WORDS)}")
    if g < 1:
        raise ConfigError(f"{key}={g} must be >= 1 (null or 1: flat)")
    if groups_needed and g < 2:
        raise ConfigError(f"{key}={g} is flat (one rank per group): groups need g >= 2 ranks")
    if world is None or g == 1:
        return
    if world % g:
        raise ConfigError(f"{key}={g} does not divide the {world} processes of this run; "
                          f"give a divisor of {world} (every group needs the same number of ranks)")
    if world // g < 2:
        raise ConfigError(f"{key}={g} with {world} processes makes {world // g} group: "
                          "hierarchical sync needs at least 2 groups; lower group_size or set it to null (flat)")


def check_ring_degree(p: int, q: int, where: str = "") -> None:
    """q <= 2p: a node of the p-symmetric ring has 2p neighbours (Definition 1 of 000)."""
    if q > 2 * p:
        raise ConfigError(f"sync.q={q} > 2 * sync.p = {2 * p}{where}: a node has only 2p ring neighbours "
                          "(Definition 1); lower sync.q or raise sync.p")


@dataclass
class HierarchyConfig:
    """Hierarchical synchronization (gossip_accel/sync/hierarchical.py; docs/ALGORITHMS.md).

    ``group_size``: ``null`` or 1 = flat (every rank is a replica); an int g = consecutive ranks
    [j g, (j+1) g) form group j; ``node`` = one group per node (g = LOCAL_WORLD_SIZE, set by
    torchrun and accelerate launch; an error on one node); ``auto`` = ``node`` when the launch
    spans several nodes, flat otherwise. Inside a group gradients are all-reduced every step;
    between groups the configured algorithm runs on the component's carrier, local rank
    ``carriers`` = ``balanced`` (greedy by bytes, largest component first) or ``round_robin``
    (component i on local rank i mod g).
    """

    group_size: Any = None
    carriers: str = "balanced"

    def resolved_group_size(self, world: int, env: Optional[dict] = None) -> int:
        """g for a run of ``world`` processes (1 = flat); errors name the key and the fix."""
        g = self.group_size
        env = os.environ if env is None else env
        if g is None:
            return 1
        if isinstance(g, str) and g in GROUP_WORDS:
            local = env.get("LOCAL_WORLD_SIZE")
            if local is None or not str(local).isdigit() or int(local) < 1:
                if g == "auto":
                    return 1
                raise ConfigError(
                    "sync.hierarchy.group_size=node needs LOCAL_WORLD_SIZE (set by torchrun and accelerate "
                    "launch); launch with one of them or give the group size as an int")
            g = int(local)
            if g >= world and self.group_size == "auto":
                return 1  # one node: nothing between nodes
        check_group_size(g, world)
        return g


@dataclass
class SyncConfig:
    """Everything the :class:`~gossip_accel.sync.synchronizer.Synchronizer` needs (see docs/ALGORITHMS.md)."""

    algorithm: str = "gossip_bmuf"
    period: int = 16
    p: Optional[int] = None
    q: Optional[int] = None
    block_momentum: Optional[float] = None
    block_lr: float = 1.0
    momentum_rule_c: float = 1.0
    nesterov: bool = True
    seed: int = 0
    components: list[ComponentRule] = field(default_factory=lambda: [ComponentRule()])
    buffers: str = "average"
    warmup_steps: int = 0
    warmup_period: int = 1
    warmup_kind: str = "average"          # average (full averages every P) | gradients (DDP) | ramp (schedule.py)
    inner_state: str = "keep"             # the inner optimizer's state at a sync: keep | reset | average
    slots_on_cpu: bool = False
    track_divergence: bool = True
    broadcast_initial: bool = True
    enabled: bool = True
    nonfinite: str = "reset"              # NaN/inf replica at a sync: reset | raise | ignore (health.py)
    exchange_dtype: str = "float32"       # the wire of the periodic syncs: float32 | bfloat16 | float16 | int8 | int4
    quant_block: int = 256                # int8/int4: elements per absmax scale (gossip_accel/sync/quantize.py)
    quant_scale_dtype: str = "float32"    # int8/int4: the scales' dtype on the wire: float32 | bfloat16
    quant_ring: str = "copies"            # int8/int4 on the ring: copies (CHOCO public copies) | params
    mixing: str = "pull"                  # gossip rounds: pull (Algorithm 1 line 7) | pair (random matching)
    # -- staggered and overlapped syncs (schedule.py, overlap.py; docs/ALGORITHMS.md) ------------------
    stagger: bool = False                 # components sharing a period H sync at offsets floor(k H / K)
    overlap_steps: int = 0                # tau: a sync posted at t is applied at t + tau (0 = blocking)
    overlap_merge: str = "delta"          # delta: rule(avg_t) + (theta_{t+tau} - theta_t) | mix | replace
    overlap_mix: float = 0.5              # alpha of overlap_merge=mix: alpha theta_{t+tau} + (1 - alpha) rule(avg_t)
    # a torch.optim optimizer on the outer gradient p - theta_bar instead of the BMUF rule (algorithms/outer.py):
    # {name: <torch.optim class>, <its keyword arguments>}; null = the paper's BMUF (eta, zeta, nesterov)
    outer_optimizer: Optional[dict[str, Any]] = None
    hierarchy: HierarchyConfig = field(default_factory=HierarchyConfig)
    # -- EASGD (eq. 8-9 of 001): alpha = eta * lambda --------------------------------------
    easgd_alpha: Optional[float] = None   # alpha itself; default 0.9 / n (beta = n alpha = 0.9)
    easgd_lambda: Optional[float] = None  # lambda of eq. 7; with easgd_eta gives alpha = eta * lambda
    easgd_eta: Optional[float] = None     # eta of eq. 8 (the workers' learning rate)
    # -- parameter server (asgd, easgd, easgd_async) -----------------------------------------
    server_rank: int = 0                  # the process (group rank) that hosts the server role
    server_lr: float = 1.0                # ASGD: w~ <- w~ + server_lr * (pushed update), eq. 2
    max_staleness: Optional[int] = None   # SSP bound: no worker more than S syncs ahead of the slowest
    # -- asynchronous algorithms (asgd, easgd_async, adpsgd_*) ---------------------------------
    lockstep: bool = False                # deterministic lock-step order instead of real asynchrony
    rpc_timeout: float = 600.0            # seconds for one RPC (and for the RPC rendezvous)
    rpc_init_method: Optional[str] = None  # RPC rendezvous; default tcp://$MASTER_ADDR:<free port of rank 0>
    # -- start-up (gossip_accel/sync/agreement.py) -------------------------------------------
    agreement_timeout: float = 120.0      # seconds the ranks wait for each other to compare fingerprints

    # -- derived quantities (from the registry entry of sync.algorithm) -------------------
    @property
    def spec(self) -> registry.Algorithm:
        """The registry entry of ``sync.algorithm`` (validate() made sure it exists)."""
        return registry.get(self.algorithm)

    @property
    def uses_bmuf(self) -> bool:
        return self.spec.bmuf_slots

    @property
    def graph(self) -> str:
        """``full`` for MA/BMUF, ``ring`` for local/gossip and ADPSGD, ``server`` for EASGD/ASGD."""
        return self.spec.graph

    @property
    def is_async(self) -> bool:
        """An asynchronous algorithm (ASGD, async EASGD, ADPSGD)."""
        return self.spec.asynchronous

    @property
    def uses_rpc(self) -> bool:
        """Asynchronous and not in lock-step mode: runs over torch.distributed.rpc."""
        return self.is_async and not self.lockstep

    def resolved_alpha(self, n: int) -> float:
        """EASGD's moving rate alpha = eta * lambda (eq. 9 of 001); default beta / n with beta = 0.9.

        Zhang et al. (EASGD, NIPS 2015) recommend beta = n * alpha = 0.9 for the synchronous
        variant; the same default keeps the asynchronous one stable.
        """
        if self.easgd_alpha is not None:
            return self.easgd_alpha
        if self.easgd_lambda is not None:
            return self.easgd_eta * self.easgd_lambda  # validate() made sure eta is set
        return 0.9 / max(n, 1)

    def resolved_p(self, n: int) -> int:
        """Symmetric degree; default ``max(1, round(log2 n) - 1)`` as in section 3.3."""
        if self.p is not None:
            return self.p
        return max(1, int(round(math.log2(max(n, 2)))) - 1)

    @property
    def round_mixing(self) -> str:
        """The mixing the algorithm's rounds use: ``sync.mixing`` on a gossip round, else ``pull``
        (MA/BMUF average over the full graph, local-* over all 2p ring neighbours: nothing to match),
        so one recipe conf with ``mixing: pair`` serves every algorithm."""
        return self.mixing if _gossip_round(self.spec) else "pull"

    def resolved_q(self, n: int) -> int:
        """Gossip neighbours; ``2p`` for local variants, else default ``min(p, 2)`` (section 3.3)."""
        p = self.resolved_p(n)
        if self.spec.all_neighbours:
            return 2 * p if self.q is None else self.q
        if self.round_mixing == "pair":
            return 1 if self.q is None else self.q  # one partner per round
        return min(p, 2) if self.q is None else self.q

    def resolved_block_momentum(self, n: int) -> float:
        """eta; default from eq. (6) of 001 in project notation: zeta * n * (1 - eta) = C."""
        from .algorithms.bmuf import block_momentum_from_rule

        if self.block_momentum is not None:
            return self.block_momentum
        return block_momentum_from_rule(n, self.block_lr, self.momentum_rule_c)


def validate(cfg: SyncConfig) -> None:
    """Check values that omegaconf's typing cannot: raises :class:`ConfigError` naming the key."""
    if cfg.algorithm not in ALGORITHMS:
        raise ConfigError(registry.unknown(cfg.algorithm))
    if cfg.period < 1:
        raise ConfigError(f"sync.period={cfg.period} must be >= 1 (a sync every H steps)")
    if cfg.buffers not in BUFFER_POLICIES:
        raise ConfigError(f"sync.buffers={cfg.buffers!r}; choose one of {', '.join(BUFFER_POLICIES)}")
    if cfg.nonfinite not in NONFINITE_POLICIES:
        raise ConfigError(
            f"sync.nonfinite={cfg.nonfinite!r}; choose one of {', '.join(NONFINITE_POLICIES)} "
            "(reset: drop and reset a NaN/inf worker; raise: stop with an error; ignore: no check)")
    if cfg.block_momentum is not None and not 0.0 <= cfg.block_momentum < 1.0:
        raise ConfigError(f"sync.block_momentum={cfg.block_momentum} must be in [0, 1)")
    if cfg.momentum_rule_c <= 0:
        raise ConfigError(f"sync.momentum_rule_c={cfg.momentum_rule_c} must be > 0 (C of eq. 6 of 001)")
    if cfg.seed < 0:
        raise ConfigError(f"sync.seed={cfg.seed} must be >= 0")
    if cfg.block_lr <= 0:
        raise ConfigError(f"sync.block_lr={cfg.block_lr} must be > 0")
    if cfg.warmup_steps < 0 or cfg.warmup_period < 1:
        raise ConfigError("sync.warmup_steps must be >= 0 and sync.warmup_period >= 1")
    if not cfg.spec.warmup and cfg.warmup_steps > 0:
        raise ConfigError(
            f"sync.warmup_steps={cfg.warmup_steps}: warm-up (full averages, then a BMUF slot restart) is "
            f"defined for {', '.join(registry.names(warmup=True))}; set sync.warmup_steps=0 for {cfg.algorithm}"
        )
    _validate_warmup_kind_and_inner_state(cfg)
    if cfg.easgd_alpha is not None and cfg.easgd_lambda is not None:
        raise ConfigError("give either sync.easgd_alpha or sync.easgd_lambda (with sync.easgd_eta), not both")
    if cfg.easgd_lambda is not None and (cfg.easgd_eta is None or cfg.easgd_eta <= 0 or cfg.easgd_lambda <= 0):
        raise ConfigError(
            f"sync.easgd_lambda={cfg.easgd_lambda} needs sync.easgd_eta > 0 (alpha = eta * lambda, eq. 9 of 001) "
            f"and lambda > 0; got sync.easgd_eta={cfg.easgd_eta}"
        )
    if cfg.easgd_eta is not None and cfg.easgd_lambda is None:
        raise ConfigError("sync.easgd_eta is only used with sync.easgd_lambda (alpha = eta * lambda)")
    alpha = cfg.resolved_alpha(2)
    if cfg.easgd_alpha is not None or cfg.easgd_lambda is not None:
        if not 0.0 < alpha < 1.0:
            raise ConfigError(
                f"EASGD moving rate alpha = {alpha} (sync.easgd_alpha, or sync.easgd_eta * sync.easgd_lambda) "
                "must be in (0, 1)"
            )
    if cfg.server_rank < 0:
        raise ConfigError(f"sync.server_rank={cfg.server_rank} must be >= 0")
    if cfg.server_lr <= 0:
        raise ConfigError(f"sync.server_lr={cfg.server_lr} must be > 0")
    if cfg.max_staleness is not None and cfg.max_staleness < 0:
        raise ConfigError(f"sync.max_staleness={cfg.max_staleness} must be >= 0 (or null: unbounded)")
    if cfg.rpc_timeout <= 0:
        raise ConfigError(f"sync.rpc_timeout={cfg.rpc_timeout} must be > 0 seconds")
    if cfg.agreement_timeout <= 0:
        raise ConfigError(f"sync.agreement_timeout={cfg.agreement_timeout} must be > 0 seconds")
    if cfg.p is not None and cfg.p < 1:
        raise ConfigError(f"sync.p={cfg.p} must be >= 1")
    if cfg.q is not None and cfg.q < 1:
        raise ConfigError(f"sync.q={cfg.q} must be >= 1")
    if cfg.p is not None and cfg.q is not None:
        check_ring_degree(cfg.p, cfg.q)
    _validate_mixing(cfg)
    _validate_overlap(cfg)
    _validate_wire_and_hierarchy(cfg)
    _validate_outer_optimizer(cfg)
    if not cfg.components:
        raise ConfigError("sync.components is empty; give at least one rule, e.g. {name: all}")
    names = set()
    for i, rule in enumerate(cfg.components):
        key = f"sync.components[{i}]"
        if rule.period is not None and rule.period < 1:
            raise ConfigError(f"{key}.period={rule.period} must be >= 1")
        if rule.shards < 1:
            raise ConfigError(f"{key}.shards={rule.shards} must be >= 1")
        if rule.name in names:
            raise ConfigError(f"{key}.name={rule.name!r} is used twice")
        names.add(rule.name)


def _validate_warmup_kind_and_inner_state(cfg: SyncConfig) -> None:
    """sync.warmup_kind (schedule.py) and sync.inner_state (inner_state.py): values, and what they work with."""
    if cfg.warmup_kind not in WARMUP_KINDS:
        raise ConfigError(f"sync.warmup_kind={cfg.warmup_kind!r}; choose one of {', '.join(WARMUP_KINDS)} "
                          "(average: full averages every sync.warmup_period steps; gradients: DDP's gradient "
                          "all-reduce; ramp: averages, then the period doubles up to sync.period)")
    if cfg.inner_state not in INNER_STATES:
        raise ConfigError(f"sync.inner_state={cfg.inner_state!r}; choose one of {', '.join(INNER_STATES)} "
                          "(what a sync does with the inner optimizer's state)")
    grouped = cfg.hierarchy.group_size not in (None, 1)
    if cfg.warmup_kind == "gradients" and grouped:
        raise ConfigError("sync.warmup_kind=gradients is not implemented with sync.hierarchy (the gradients are "
                          "already all-reduced inside a group): use warmup_kind=average or group_size=null")
    if cfg.inner_state != "keep" and (cfg.spec.family != "periodic" or grouped):
        periodic = registry.names(family="periodic")
        raise ConfigError(f"sync.inner_state={cfg.inner_state} is implemented for the flat {', '.join(periodic)}; "
                          f"{cfg.algorithm}{' with sync.hierarchy' if grouped else ''}: set sync.inner_state=keep")
    if cfg.inner_state == "average" and cfg.exchange_dtype in ("int8", "int4"):
        raise ConfigError(f"sync.inner_state=average with sync.exchange_dtype={cfg.exchange_dtype} is not implemented "
                          "(the state has no coded reference): use a float wire or sync.inner_state=keep|reset")
    if cfg.inner_state != "keep" and cfg.overlap_steps > 0:
        raise ConfigError(f"sync.inner_state={cfg.inner_state} with sync.overlap_steps={cfg.overlap_steps}: the state "
                          "would be exchanged at the post step and the parameters tau steps later; not implemented "
                          "(set sync.inner_state=keep or sync.overlap_steps=0)")


def _validate_mixing(cfg: SyncConfig) -> None:
    """sync.mixing: a value of MIXINGS; ``pair`` on a gossip round (ring, q < 2p) needs q = 1. Other
    algorithms have no round to match and keep their own averaging (:attr:`SyncConfig.round_mixing`)."""
    if cfg.mixing not in MIXINGS:
        raise ConfigError(f"sync.mixing={cfg.mixing!r}; choose one of {', '.join(MIXINGS)} "
                          "(pull: each node averages with q neighbours it picks; pair: random ring matching)")
    if cfg.round_mixing == "pair" and cfg.q not in (None, 1):
        raise ConfigError(f"sync.mixing=pair gives every node one partner per round, but sync.q={cfg.q}; "
                          "drop sync.q (or set it to 1), or use sync.mixing=pull")


def _validate_overlap(cfg: SyncConfig) -> None:
    """sync.stagger / sync.overlap_*: the algorithms that implement them (registry ``overlap``), a merge of
    OVERLAP_MERGES, tau below every period (one exchange in flight per component), alpha in [0, 1]."""
    tau = cfg.overlap_steps
    if tau < 0:
        raise ConfigError(f"sync.overlap_steps={tau} must be >= 0 (0: blocking syncs)")
    if (tau > 0 or cfg.stagger) and not cfg.spec.overlap:
        key = "sync.overlap_steps" if tau > 0 else "sync.stagger"
        raise ConfigError(f"{key} is implemented for {', '.join(registry.names(overlap=True))}; "
                          f"{cfg.algorithm} syncs as it is: set sync.overlap_steps=0 and sync.stagger=false")
    if cfg.overlap_merge not in OVERLAP_MERGES:
        raise ConfigError(f"sync.overlap_merge={cfg.overlap_merge!r}; choose one of {', '.join(OVERLAP_MERGES)} "
                          "(delta: carry the local progress of the tau steps; mix: Streaming DiLoCo's mixing; "
                          "replace: drop it)")
    if not 0.0 <= cfg.overlap_mix <= 1.0:
        raise ConfigError(f"sync.overlap_mix={cfg.overlap_mix} must be in [0, 1]")
    periods = [cfg.period] + [r.period for r in cfg.components if r.period is not None]
    if tau > 0 and tau >= min(periods):
        raise ConfigError(f"sync.overlap_steps={tau} must be below every period (the smallest is {min(periods)}): "
                          "a component has one exchange in flight at a time")
    if tau > 0 and cfg.exchange_dtype != "float32" and cfg.spec.graph == "full":
        raise ConfigError(f"sync.overlap_steps={tau} with sync.exchange_dtype={cfg.exchange_dtype} on the full graph "
                          f"({cfg.algorithm}) is not implemented (its two-phase wire is blocking); "
                          "use sync.exchange_dtype=float32 or a gossip algorithm")


def _validate_outer_optimizer(cfg: SyncConfig) -> None:
    """sync.outer_optimizer: a torch.optim class name and its keyword arguments, built once on a dummy
    tensor; only for the algorithms with BMUF slots (it replaces their rule: eta, zeta and nesterov unused)."""
    spec = cfg.outer_optimizer
    if spec is None:
        return
    key = "sync.outer_optimizer"
    if not cfg.spec.outer_optimizer:
        raise ConfigError(f"{key} replaces the BMUF rule of {', '.join(registry.names(outer_optimizer=True))}; "
                          f"{cfg.algorithm} has no block update: set {key}=null")
    from .algorithms import outer

    try:
        cls = outer.optimizer_class(spec.get("name"))
    except ValueError as e:
        raise ConfigError(f"{key}.{e} (e.g. {{name: SGD, lr: 0.7, momentum: 0.9, nesterov: true}})") from None
    bad = outer.unknown_kwargs(cls, {k: v for k, v in spec.items() if k != "name"})
    if bad:
        raise ConfigError(f"{key}.{bad[0]} is not an argument of torch.optim.{cls.__name__}")
    import torch

    try:  # built, and one step taken, on a dummy tensor (LBFGS needs a closure, SparseAdam sparse gradients)
        dummy = torch.zeros(1)
        opt = outer.make_optimizer(spec, dummy)
        dummy.grad = torch.zeros(1)
        opt.step()
    except (ValueError, TypeError, RuntimeError) as e:
        raise ConfigError(f"{key}={spec!r}: torch.optim.{cls.__name__} refuses it: {one_line_error(e)}") from None
    if cfg.block_momentum is not None:
        warnings.warn(f"sync.block_momentum={cfg.block_momentum} is unused: {key} replaces the BMUF rule "
                      "(give the outer optimizer's own momentum)", stacklevel=3)


def _gossip_round(spec: registry.Algorithm) -> bool:
    """Algorithm 1 on the ring with q < 2p drawn neighbours (gossip-MA/BMUF)."""
    return spec.family == "periodic" and spec.graph == "ring" and not spec.all_neighbours


def _validate_wire_and_hierarchy(cfg: SyncConfig) -> None:
    """sync.exchange_dtype and sync.hierarchy: values, and the algorithms they work with."""
    if cfg.exchange_dtype not in EXCHANGE_DTYPES:
        raise ConfigError(f"sync.exchange_dtype={cfg.exchange_dtype!r}; choose one of {', '.join(EXCHANGE_DTYPES)}")
    if cfg.exchange_dtype != "float32" and not cfg.spec.low_precision_wire:
        raise ConfigError(
            f"sync.exchange_dtype={cfg.exchange_dtype} is implemented for {', '.join(registry.names(low_precision_wire=True))}; "
            f"{cfg.algorithm} exchanges fp32 (its server/pairwise messages are not cast): set sync.exchange_dtype=float32")
    _validate_quantized(cfg)
    h = cfg.hierarchy
    if h.carriers not in CARRIER_POLICIES:
        raise ConfigError(f"sync.hierarchy.carriers={h.carriers!r}; choose one of {', '.join(CARRIER_POLICIES)}")
    g = h.group_size
    if g is not None and not (isinstance(g, str) and g in GROUP_WORDS):
        check_group_size(g)
    if g not in (None, 1) and not cfg.spec.hierarchy:
        raise ConfigError(
            f"sync.hierarchy.group_size={g!r} is implemented for {', '.join(registry.names(hierarchy=True))}; "
            f"{cfg.algorithm} runs flat: set sync.hierarchy.group_size=null")


def _validate_quantized(cfg: SyncConfig) -> None:
    """sync.quant_*: the int8/int4 wire's block size, scale dtype and ring scheme."""
    if not isinstance(cfg.quant_block, int) or isinstance(cfg.quant_block, bool) or cfg.quant_block < 1:
        raise ConfigError(f"sync.quant_block={cfg.quant_block!r} must be an int >= 1 (elements per scale)")
    if cfg.quant_scale_dtype not in QUANT_SCALE_DTYPES:
        raise ConfigError(f"sync.quant_scale_dtype={cfg.quant_scale_dtype!r}; choose one of {', '.join(QUANT_SCALE_DTYPES)}")
    if cfg.quant_ring not in QUANT_RINGS:
        raise ConfigError(f"sync.quant_ring={cfg.quant_ring!r}; choose one of {', '.join(QUANT_RINGS)}")
    if cfg.exchange_dtype in ("int8", "int4") and cfg.enabled and not cfg.broadcast_initial:
        raise ConfigError(f"sync.exchange_dtype={cfg.exchange_dtype} quantizes differences from references that "
                          "start at the broadcast theta_0: set sync.broadcast_initial=true")


def validate_for_world(cfg: SyncConfig, n: int) -> None:
    """Checks that need the number of workers n (the Synchronizer and the simulator call it)."""
    if n < 2 or not cfg.enabled:
        return
    spec = cfg.spec
    if spec.family == "periodic" and spec.graph == "ring":
        check_ring_degree(cfg.resolved_p(n), cfg.resolved_q(n), f" with n={n}")
    if spec.graph == "server" and not 0 <= cfg.server_rank < n:
        raise ConfigError(f"sync.server_rank={cfg.server_rank} is not a rank of this run (n={n})")
    if spec.rule == "easgd" and not spec.asynchronous and n * cfg.resolved_alpha(n) >= 2.0:
        raise ConfigError(
            f"synchronous EASGD with n={n} and alpha={cfg.resolved_alpha(n):g}: beta = n * alpha >= 2 makes the "
            "centre variable diverge (eq. 8 of 001); lower sync.easgd_alpha (or sync.easgd_eta * sync.easgd_lambda)"
        )


def one_line_error(e: BaseException, prefix: str = "") -> str:
    """An omegaconf / YAML / decoding error as one line that names the key (``prefix`` + omegaconf's
    ``full_key``) or the line and column, for :class:`ConfigError` messages."""
    if isinstance(e, OmegaConfBaseException) and getattr(e, "msg", None):
        key = getattr(e, "full_key", None)
        msg = str(e.msg).strip().splitlines()[0]   # omegaconf appends full_key/object_type lines
        return f"{msg} (key {prefix}{key})" if key else msg
    if isinstance(e, UnicodeDecodeError):
        line = e.object.count(b"\n", 0, e.start) + 1 if isinstance(e.object, bytes) else "?"
        return f"line {line}: not UTF-8 (byte 0x{e.object[e.start]:02x}); save the file as UTF-8"
    return " ".join(str(e).split())


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply ``key=value`` dotlist overrides in place; list items by index work too.

    ``sync.components.0.period=64`` and ``sync.components[0].period=64`` both address the first
    component rule. Values are parsed as YAML (``true``, ``8``, ``[1, 2]``, ``null``). A key
    that the schema does not know, or a value of the wrong type, raises :class:`ConfigError`.
    """
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            OmegaConf.update(cfg, key.strip(), yaml.safe_load(value) if value else None, merge=True)
        except (OmegaConfBaseException, ValueError, TypeError, IndexError) as e:
            raise ConfigError(f"override {item!r}: {one_line_error(e)}".strip()) from e
    return cfg


def load_sync_config(
    source: Any = None, overrides: Sequence[str] = (), key: str = "sync"
) -> SyncConfig:
    """Build a validated :class:`SyncConfig`.

    ``source`` may be ``None`` (defaults), a YAML path, a dict / DictConfig (either the sync
    section itself or a whole config that has a ``sync`` key) or a SyncConfig.
    ``overrides`` are omegaconf dotlist strings, with or without the ``sync.`` prefix.
    """
    schema = OmegaConf.structured(SyncConfig)
    try:
        if source is None:
            loaded: Any = OmegaConf.create({})
        elif isinstance(source, SyncConfig):
            loaded = OmegaConf.structured(source)
        elif isinstance(source, (dict, DictConfig)):
            loaded = OmegaConf.create(source)
        else:
            loaded = load_yaml_mapping(source, key)
        if isinstance(loaded, DictConfig) and key in loaded:
            loaded = loaded[key]
        _check_rule_keys(loaded, key, source)
        stripped = [o[len(key) + 1:] if o.startswith(key + ".") else o for o in overrides]
        merged = apply_overrides(OmegaConf.merge(schema, loaded), stripped)
        cfg: SyncConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except FileNotFoundError as e:
        raise ConfigError(f"sync config file not found: {source}") from e
    except IsADirectoryError as e:
        raise ConfigError(f"sync config {source} is a directory; give a YAML file") from e
    except (OmegaConfBaseException, TypeError, yaml.YAMLError, UnicodeDecodeError) as e:
        where = f" in {source}" if isinstance(source, (str, os.PathLike)) else ""
        raise ConfigError(f"bad sync config{where}: {one_line_error(e, key + '.')}".strip()) from e
    try:
        validate(cfg)
    except ConfigError as e:
        if isinstance(source, (str, os.PathLike)):   # name the file too
            raise ConfigError(f"{source}: {e}") from None
        raise
    return cfg


def load_yaml_mapping(path: Any, key: str = "sync") -> DictConfig:
    """A YAML file whose top level is a non-empty mapping (and whose ``key`` section, if any, is one
    too); an empty file or a list is a :class:`ConfigError` naming the file, not the defaults."""
    loaded = OmegaConf.load(str(path))
    example = f"write `{key}:` with its keys, e.g. `{key}: {{algorithm: gossip_bmuf, period: 16}}`"
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: the top level is a list, not a mapping; {example}")
    if len(loaded) == 0:
        raise ConfigError(f"{path}: empty (no keys); {example}, or pass no config file for the defaults")
    if key in loaded and not isinstance(loaded[key], DictConfig):
        raise ConfigError(f"{path}: `{key}:` must be a mapping of sync keys, got {loaded[key]!r}; {example}")
    return loaded


def _check_rule_keys(loaded: Any, key: str, source: Any) -> None:
    """Unknown keys of ``components`` items, named with their index (omegaconf names only the
    key: ``peroid`` instead of ``sync.components[1].peroid``) and the file."""
    rules = loaded.get("components") if isinstance(loaded, DictConfig) else None
    if not isinstance(rules, ListConfig):
        return
    where = f"{source}: " if isinstance(source, (str, os.PathLike)) else ""
    known = set(ComponentRule.__dataclass_fields__)
    for i, rule in enumerate(rules):
        if not isinstance(rule, DictConfig):
            raise ConfigError(f"{where}{key}.components[{i}] must be a mapping such as {{name: all}}, got {rule!r}")
        for k in rule:
            if k not in known:
                raise ConfigError(f"{where}{key}.components[{i}].{k} is not a component rule key; "
                                  f"use {', '.join(sorted(known))}")
