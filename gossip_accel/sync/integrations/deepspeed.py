"""DeepSpeed integration: the synchronizer on a ``DeepSpeedEngine`` (ZeRO-0 in fp32, bf16, fp16;
ZeRO-1/2 inside replica groups).

Used like the Accelerate integration::

    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=torch_opt, config=ds_config)
    with DeepSpeedSynchronizer(engine, "conf/sync.yaml") as sync:
        for batch in loader:
            loss = engine(batch); engine.backward(fp16_loss(engine, loss)); engine.step()
            sync.step()            # counts engine steps (global_steps), not micro-batches
    # leaving the block averaged all replicas (Algorithm 1, line 20)

ZeRO-0, what it changes on the engine: ``engine.enable_backward_allreduce = False`` (each replica
keeps its own gradients; DeepSpeed's 0/1 Adam uses the same switch). Algorithm 1 of
000_07fa007f7f1023ae.txt then runs on *the weights the optimizer really updates*:

* fp32: the module's parameters;
* fp16 / bf16 (ZeRO-0 builds ``FP16_UnfusedOptimizer`` for a torch optimizer and ``FP16_Optimizer``
  for DeepSpeed's FusedAdam, both with ``low_precision_dtype`` fp16 or bf16): the optimizer's fp32
  master copy. Components are built on the masters under the module's parameter names (so
  ``sync.components`` patterns apply unchanged), and after every synchronization (the initial
  broadcast, line 1; each sync of lines 6-17; the final average, line 20) the low-precision model
  weights are rewritten from the synchronized masters.

Loss scaling: DeepSpeed's overflow check (``runtime.utils.CheckOverflow.has_overflow``) all-reduces
the overflow flag (MAX) over the world group exactly when ``enable_backward_allreduce`` is False,
so all ranks skip the same steps and keep the same dynamic loss scale. It is one byte per step, but
it is a collective per step: that is why the asynchronous (RPC) algorithms are refused in fp16/bf16.
:func:`fp16_loss` works around DeepSpeed 0.19.8's unscaled fp16 loss in ``engine.backward``.

ZeRO >= 1 partitions the optimizer state and the fp32 master across the data-parallel ranks, so
no rank holds a whole replica: it works only inside replica groups (:class:`ReplicaGroups` as the
engine's ``mpu``; ZeRO inside a group every step, Algorithm 1 between the groups on each rank's
fp32 partition), and is refused otherwise (:func:`check_engine`).
Checkpoints (ZeRO-0): :func:`save_checkpoint` / :func:`load_checkpoint` write one DeepSpeed
checkpoint per replica (the replicas differ between synchronizations) with the synchronizer's state
in DeepSpeed's ``client_state``. docs/DEEPSPEED.md has the details and what was measured.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from ..comm import Communicator
from ..config import ConfigError, check_group_size, load_sync_config
from ..schedule import applied_at
from ..synchronizer import Synchronizer

CLIENT_STATE_KEY = "gossip_accel_synchronizer"
# DeepSpeed releases whose ZeRO-0 fp16 ``engine.backward(loss)`` does not multiply the loss by the
# loss scale although FP16_Optimizer / FP16_UnfusedOptimizer.step() divides the gradients by it
# (every step shrinks by the scale; upstream deepspeedai/DeepSpeed PR #8393). Checked by reading
# and running 0.19.8 here; add a version only after checking it the same way.
UNSCALED_FP16_BACKWARD = {"0.19.8"}


def _fp16_zero0_unscaled(engine: Any) -> bool:
    """True where ``engine.backward`` leaves the fp16 loss unscaled (see UNSCALED_FP16_BACKWARD)."""
    import deepspeed
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    return (bool(engine.fp16_enabled()) and engine.optimizer is not None
            and not isinstance(engine.optimizer, ZeROOptimizer) and hasattr(engine.optimizer, "loss_scale")
            and deepspeed.__version__ in UNSCALED_FP16_BACKWARD)


def fp16_loss(engine: Any, loss: torch.Tensor) -> torch.Tensor:
    """The loss to hand to ``engine.backward`` / ``accelerator.backward``: ``loss * loss_scale``
    where DeepSpeed forgets to scale it (ZeRO-0 fp16 on the releases in UNSCALED_FP16_BACKWARD),
    else ``loss`` unchanged. This is what FP16_UnfusedOptimizer.backward does (fp32 loss times the
    current dynamic scale), so the optimizer's overflow check and unscaling see what they expect.
    """
    if _fp16_zero0_unscaled(engine):
        return loss.float() * engine.optimizer.loss_scale
    return loss


def check_engine(engine: Any, cfg: Any) -> None:
    """Refuse the combinations that cannot work, with the one that does."""
    stage = int(engine.zero_optimization_stage())
    groups = replica_groups_of(engine)
    if stage >= 1 and cfg.enabled and groups is None:
        raise ConfigError(
            f"DeepSpeed zero_optimization.stage={stage} partitions the optimizer (and the fp32 master) "
            "over the data-parallel ranks, so no rank holds a whole replica to synchronize. Use "
            "zero_optimization.stage=0 with the synchronizer, or ZeRO inside a replica group with the "
            "synchronizer between replica groups: deepspeed.initialize(..., mpu=ReplicaGroups(group_size)) "
            "(gossip_accel.sync.integrations.deepspeed; docs/DEEPSPEED.md)"
        )
    if groups is not None and cfg.enabled:
        if stage not in (1, 2):
            raise ConfigError(f"ReplicaGroups works with zero_optimization.stage 1 or 2, got {stage}; ZeRO-3 "
                              "partitions the weights too (use stage 1/2 inside a group, or stage 0 without groups)")
        if engine.fp16_enabled():
            raise ConfigError(
                "fp16 with ZeRO inside replica groups: DeepSpeed all-reduces the overflow flag only inside "
                "the group, so the loss scales of the groups could drift apart; use bf16 or fp32 with "
                "ReplicaGroups, or fp16 with zero_optimization.stage=0 and no groups")
        if cfg.uses_rpc:
            raise ConfigError(f"sync.algorithm={cfg.algorithm} (asynchronous, RPC) is not supported between "
                              "ZeRO replica groups; use ma, bmuf, local_* or gossip_*")
        if any(r.pattern is not None or r.shards > 1 for r in cfg.components):
            raise ConfigError(
                "with ZeRO inside replica groups a rank holds a flat partition of the fp32 master that cuts "
                "through parameters, so it is synchronized as ONE component: drop the patterns/shards of "
                "sync.components and set the period with sync.period")
    group_size = getattr(getattr(cfg, "hierarchy", None), "group_size", None)
    mine = groups.layout.group_size if groups is not None else 1
    if cfg.enabled and group_size not in (None, 1, mine):
        raise ConfigError(
            f"sync.hierarchy.group_size={group_size!r} but the DeepSpeed engine has "
            f"{'no replica groups' if groups is None else f'replica groups of {mine}'}: with DeepSpeed the groups "
            "come from deepspeed.initialize(..., mpu=ReplicaGroups(g)) and ZeRO stage 1/2; set "
            "sync.hierarchy.group_size=null (or to g)"
        )
    if getattr(engine, "pipeline_parallelism", False) and cfg.enabled:
        raise ConfigError("DeepSpeed pipeline parallelism is not supported by the synchronizer; "
                          "use a plain (non-pipeline) DeepSpeedEngine with ZeRO stage 0")
    low_precision = bool(engine.fp16_enabled() or engine.bfloat16_enabled())
    if low_precision and cfg.enabled and cfg.uses_rpc:
        raise ConfigError(
            f"sync.algorithm={cfg.algorithm} is asynchronous, but DeepSpeed fp16/bf16 all-reduces the "
            "overflow flag over all ranks at every step (lock-step, and a rank that does not step hangs "
            "the others); use fp32 (no fp16/bf16 block in the DeepSpeed config) or a synchronous algorithm "
            "(ma, bmuf, local_*, gossip_*)"
        )


def master_pairs(engine: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, master, model weight) for every trainable parameter of ``engine.module``.

    The master is the tensor the optimizer updates: the parameter itself in fp32, the fp32 copy of
    DeepSpeed's FP16_UnfusedOptimizer (``fp32_groups``) or FP16_Optimizer (views into
    ``fp32_groups_flat``) in fp16/bf16. An unknown optimizer wrapper in low precision is an error.
    """
    from torch._utils import _unflatten_dense_tensors

    named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    opt = engine.optimizer
    low_precision = bool(engine.fp16_enabled() or engine.bfloat16_enabled())
    if not low_precision:
        return [(n, p, p) for n, p in named]
    master_of: dict[int, torch.Tensor] = {}
    if hasattr(opt, "fp16_groups") and hasattr(opt, "fp32_groups"):  # FP16_UnfusedOptimizer
        for lp_group, fp32_group in zip(opt.fp16_groups, opt.fp32_groups):
            for lp, master in zip(lp_group, fp32_group):
                master_of[id(lp)] = master
    elif hasattr(opt, "fp16_groups") and hasattr(opt, "fp32_groups_flat"):  # FP16_Optimizer (fused)
        for lp_group, flat in zip(opt.fp16_groups, opt.fp32_groups_flat):
            for lp, master in zip(lp_group, _unflatten_dense_tensors(flat, lp_group)):
                master_of[id(lp)] = master
    else:
        raise ConfigError(
            f"DeepSpeed built optimizer wrapper {type(opt).__name__}, whose fp32 master copy the "
            "synchronizer does not know; supported with fp16/bf16: ZeRO stage 0 (FP16_Optimizer or "
            "FP16_UnfusedOptimizer; bf16 needs data_types.grad_accum_dtype unset or bf16)"
        )
    missing = [n for n, p in named if id(p) not in master_of]
    if missing:
        raise ConfigError(
            f"trainable parameters {missing[:5]} are not in the DeepSpeed optimizer; pass all trainable "
            "parameters to deepspeed.initialize (or set requires_grad=False on the frozen ones)"
        )
    return [(n, master_of[id(p)], p) for n, p in named]


class ReplicaGroups:
    """The ``mpu`` to pass to ``deepspeed.initialize`` for ZeRO inside replica groups.

    The W ranks form W / g groups of g consecutive ranks (``gossip_accel.sync.hierarchical.GroupLayout``).
    DeepSpeed's data-parallel group becomes the *intra* group: ZeRO-1/2 partitions the optimizer
    and reduces the gradients there, every step, so a group is one replica of Algorithm 1 (its
    mini-batch the union of its ranks'). The synchronizer then runs between the groups on each
    rank's fp32 partition, with the ranks of the same local rank in the other groups (the *cross*
    group). Model parallelism is 1 (a singleton group per rank). A collective: every rank builds it.
    """

    def __init__(self, group_size: int):
        from ..hierarchical import GroupLayout, ProcessGroups

        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError("ReplicaGroups needs torch.distributed initialized first "
                              "(deepspeed.init_distributed or torch.distributed.init_process_group)")
        world = dist.get_world_size()
        check_group_size(group_size, world, "ReplicaGroups group_size", groups_needed=True)
        self.layout = GroupLayout(world, group_size)
        pgs = ProcessGroups.create(self.layout)
        self.intra, self.cross = pgs.intra, pgs.cross
        rank = dist.get_rank()
        singles = [dist.new_group([r]) for r in range(world)]  # every rank creates every group (torch's rule)
        self._single = singles[rank]

    # the mpu interface DeepSpeed reads
    def get_model_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_group(self):
        return self._single

    def get_data_parallel_group(self):
        return self.intra

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank(self.intra)

    def get_data_parallel_world_size(self) -> int:
        return dist.get_world_size(self.intra)


def replica_groups_of(engine: Any) -> Optional[ReplicaGroups]:
    mpu = getattr(engine, "mpu", None)
    return mpu if isinstance(mpu, ReplicaGroups) else None


def partition_pairs(engine: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, this rank's fp32 partition, same) of every optimizer group of a ZeRO-1/2 optimizer.

    The partitions of the ranks with the same local rank cover the same elements in every group
    (same model, same group size), so they are averaged element by element. DeepSpeed's padding
    of the last partition is averaged too (zeros, harmless).
    """
    opt = engine.optimizer
    parts = getattr(opt, "single_partition_of_fp32_groups", None)
    if parts is None or not hasattr(opt, "update_lp_params"):
        raise ConfigError(f"DeepSpeed built {type(opt).__name__} for ZeRO stage {engine.zero_optimization_stage()}; "
                          "the synchronizer knows DeepSpeedZeroOptimizer (stage 1/2, fp32 or bf16 with "
                          "data_types.grad_accum_dtype unset or bf16)")
    return [(f"zero_partition.{i}", p, p) for i, p in enumerate(parts)]


class _MasterView(torch.nn.Module):
    """What the Synchronizer splits into components: the masters under the module's names, and
    the module's own buffers (BatchNorm statistics follow ``sync.buffers`` as without DeepSpeed)."""

    def __init__(self, module: torch.nn.Module, pairs: list[tuple[str, torch.Tensor, torch.Tensor]]):
        super().__init__()
        object.__setattr__(self, "_inner", module)  # not a submodule: its parameters are not ours
        object.__setattr__(self, "_pairs", pairs)

    def named_parameters(self, *args, **kwargs) -> Iterator[tuple[str, torch.Tensor]]:  # type: ignore[override]
        for name, master, _ in self._pairs:
            yield name, master

    def named_buffers(self, *args, **kwargs):  # type: ignore[override]
        return self._inner.named_buffers(*args, **kwargs)


class DeepSpeedSynchronizer(Synchronizer):
    """:class:`Synchronizer` on the fp32 weights a ``DeepSpeedEngine`` updates.

    ZeRO-0 (every rank one replica): the gradient all-reduce is switched off and the components
    are the masters under the module's parameter names. ZeRO-1/2 inside replica groups (the
    engine was built with ``mpu=ReplicaGroups(g)``): DeepSpeed keeps reducing the gradients inside
    the group, the synchronizer runs between the groups (n = W / g nodes of Algorithm 1) on this
    rank's fp32 partition, one component of period ``sync.period``, and DeepSpeed's all-gather
    (``optimizer.update_lp_params``) then refreshes the group's weights.

    ``step()`` is called after every ``engine.step()`` (also on micro-batches under gradient
    accumulation): it counts one optimizer step each time ``engine.global_steps`` advanced, which
    includes steps DeepSpeed skipped on fp16 overflow (skipped on every rank alike).
    """

    def __init__(
        self,
        engine: Any,
        config: Any = None,
        overrides: Sequence[str] = (),
        process_group: Optional[dist.ProcessGroup] = None,
    ):
        cfg = load_sync_config(config, overrides)
        if cfg.warmup_kind == "gradients" or cfg.inner_state != "keep":
            raise ConfigError("sync.warmup_kind=gradients and sync.inner_state are not implemented on DeepSpeed "
                              "(it owns the gradients and the optimizer state): set warmup_kind=average, inner_state=keep")
        check_engine(engine, cfg)
        self.ds_engine = engine
        self.low_precision = bool(engine.fp16_enabled() or engine.bfloat16_enabled())
        self.replica_groups = replica_groups_of(engine) if cfg.enabled else None
        if self.replica_groups is not None:
            if process_group is not None:
                raise ConfigError("with ReplicaGroups the synchronizer runs on their cross-group process "
                                  "group; do not pass process_group")
            self._pairs = partition_pairs(engine)
            process_group = self.replica_groups.cross
            self._intra_comm = Communicator(self.replica_groups.intra)  # the buffers inside a group
        else:
            self._pairs = master_pairs(engine)
        super().__init__(_MasterView(engine.module, self._pairs), cfg, (), process_group)
        if self.cfg.enabled and self.replica_groups is None:
            engine.enable_backward_allreduce = False
        if _fp16_zero0_unscaled(engine):
            warnings.warn(
                "DeepSpeed ZeRO-0 fp16: this DeepSpeed's engine.backward(loss) does not apply the loss scale "
                "but its optimizer divides the gradients by it (deepspeedai/DeepSpeed PR #8393); pass "
                "gossip_accel.sync.integrations.deepspeed.fp16_loss(engine, loss) to engine.backward / "
                "accelerator.backward", stacklevel=2)
        self._engine_steps = int(engine.global_steps)
        self.refresh_model_weights()  # after the initial broadcast (line 1)

    def owned_module(self) -> torch.nn.Module:
        """The engine's module (one synchronizer per engine; ``self.model`` is a view of its masters)."""
        return self.ds_engine.module

    def refresh_model_weights(self) -> None:
        """Write the (synchronized) fp32 masters into the model weights the forward pass uses.

        ZeRO-0: a copy into the fp16/bf16 weights (nothing in fp32: the master is the weight).
        Replica groups: DeepSpeed's own partition copy + all-gather inside the group (a collective
        of the group: every rank calls it at the same steps, which the schedule guarantees).
        """
        if self.replica_groups is not None:
            self.ds_engine.optimizer.update_lp_params()
            return
        if not self.low_precision:
            return
        with torch.no_grad():
            for _, master, weight in self._pairs:
                weight.copy_(master)

    def _synced_at(self, t: int) -> bool:
        cfg = self.cfg
        return cfg.uses_rpc or any(applied_at(t, c.period, cfg.warmup_steps, cfg.warmup_period, c.offset,
                                              cfg.overlap_steps, cfg.warmup_kind) for c in self.components)

    def step(self) -> None:
        """Synchronize what is due if the engine took an optimizer step since the last call."""
        now = int(self.ds_engine.global_steps)
        if now == self._engine_steps:
            return  # a micro-batch inside gradient accumulation
        self._engine_steps = now
        super().step()
        if self.active and self._synced_at(self.t):
            self.refresh_model_weights()

    def finalize(self) -> None:
        super().finalize()
        self.refresh_model_weights()

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._engine_steps = int(self.ds_engine.global_steps)

    def _before_buffers(self, buffers: Any) -> None:
        """Replica groups: the float buffers (each rank normalizes its own batch) are first averaged
        (or taken from local rank 0) inside the group, then synchronized between groups."""
        if self.replica_groups is not None:
            from ..hierarchical import share_buffers_in_group

            share_buffers_in_group(self._intra_comm, buffers, self.cfg.buffers)


# -- checkpoints -------------------------------------------------------------------------------
def _replica_dir(save_dir: str, rank: int) -> str:
    return os.path.join(save_dir, f"replica{rank}")


def save_checkpoint(engine: Any, sync: DeepSpeedSynchronizer, save_dir: str, tag: Optional[str] = None,
                    client_state: Optional[dict] = None) -> str:
    """``engine.save_checkpoint`` for diverged replicas; returns the tag. A collective: every rank calls it.

    DeepSpeed writes the model/optimizer file on data-parallel rank 0 only (replicas are equal
    under its all-reduce); here they differ, so every rank writes its own checkpoint under
    ``save_dir/replica<rank>/<tag>/`` with ``sync.state_dict()`` in the client state. ``save_dir/latest``
    names the tag, as DeepSpeed's does.
    """
    if getattr(sync, "replica_groups", None) is not None:
        raise ConfigError("save_checkpoint with ZeRO replica groups is not built yet (each rank's BMUF slots "
                          "and ZeRO partition would need a per-group layout); checkpoint ZeRO-0 runs, "
                          "see docs/DEEPSPEED.md")
    state = dict(client_state or {})
    if CLIENT_STATE_KEY in state:
        raise ConfigError(f"client_state key {CLIENT_STATE_KEY!r} is reserved for the synchronizer's state")
    state[CLIENT_STATE_KEY] = sync.state_dict()
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = _replica_dir(save_dir, rank)
    os.makedirs(os.path.join(mine, tag), exist_ok=True)
    writer = engine.save_non_zero_checkpoint
    engine.save_non_zero_checkpoint = True
    try:
        engine.save_checkpoint(mine, tag=tag, client_state=state, save_latest=False)
    finally:
        engine.save_non_zero_checkpoint = writer
    if rank == 0:
        with open(os.path.join(save_dir, "latest"), "w") as f:
            f.write(tag)
    if dist.is_initialized():
        dist.barrier()
    return tag


def load_checkpoint(engine: Any, sync: DeepSpeedSynchronizer, load_dir: str, tag: Optional[str] = None,
                    **kwargs: Any) -> tuple[str, dict]:
    """Restore what :func:`save_checkpoint` wrote (this rank's replica and synchronizer state).

    Returns (checkpoint path, the remaining client state). ``kwargs`` go to ``engine.load_checkpoint``.
    """
    if tag is None:
        latest = os.path.join(load_dir, "latest")
        if not os.path.isfile(latest):
            raise FileNotFoundError(f"{latest} does not exist; pass tag= or point load_dir at a directory "
                                    "written by gossip_accel.sync.integrations.deepspeed.save_checkpoint")
        with open(latest) as f:
            tag = f.read().strip()
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = _replica_dir(load_dir, rank)
    if not os.path.isdir(os.path.join(mine, str(tag))):
        raise FileNotFoundError(f"no checkpoint {os.path.join(mine, str(tag))} for rank {rank}; resume with "
                                "the number of processes that wrote it")
    path, client = engine.load_checkpoint(mine, tag=str(tag), **kwargs)
    if path is None:
        raise FileNotFoundError(f"DeepSpeed could not load {os.path.join(mine, str(tag))}")
    client = dict(client or {})
    if CLIENT_STATE_KEY not in client:
        raise ConfigError(f"{path} has no {CLIENT_STATE_KEY!r} in its client state: it was not written by "
                          "gossip_accel.sync.integrations.deepspeed.save_checkpoint")
    sync.load_state_dict(client.pop(CLIENT_STATE_KEY))
    sync.refresh_model_weights()
    return path, client
