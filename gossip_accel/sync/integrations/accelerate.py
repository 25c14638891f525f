"""Accelerate integration: switch off DDP's gradient all-reduce and synchronize models instead.

Used like accelerate's ``LocalSGD``::

    accelerator = Accelerator(cpu=True)          # or on GPUs: Accelerator()
    model, opt, loader = accelerator.prepare(model, opt, loader)
    with AccelerateSynchronizer(accelerator, model, "conf/sync.yaml") as sync:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(batch); accelerator.backward(loss); opt.step(); opt.zero_grad()
            sync.step()                            # counts optimizer steps only
    # leaving the block averaged all replicas (Algorithm 1, line 20)

What it changes on the DDP wrapper: a no-op communication hook (gradients stay local; the
Future returns the bucket untouched), and ``broadcast_buffers = False`` unless the buffer
policy is ``broadcast`` (``forward_sync_buffers`` on torch >= 2.14) (DDP would otherwise overwrite every rank's BatchNorm statistics with
rank 0's at every forward).

A model prepared by Accelerate's DeepSpeed plugin (a ``DeepSpeedEngine``) gets a
:class:`gossip_accel.sync.integrations.deepspeed.DeepSpeedSynchronizer` instead (docs/DEEPSPEED.md).
"""

import sys
import weakref
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..comm import Counter, ring_allreduce_bytes
from ..config import ConfigError, load_sync_config
from ..hierarchical import HierarchicalSynchronizer, resolved_group_size
from ..synchronizer import Synchronizer
from ..usage import UsageError
from ..warmup import warmup_ddp_hook

#: DDP models whose communication hook a synchronizer registered (torch allows one per model)
_HOOKED: "weakref.WeakKeyDictionary[DistributedDataParallel, Any]" = weakref.WeakKeyDictionary()


def noop_allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook that communicates nothing: each replica keeps its own gradients."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def counting_allreduce_hook(state: Counter, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce-mean hook, plus a byte count (ring model) in ``state``.

    Used to measure the DDP baseline with the same accounting as the synchronizer.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buf = bucket.buffer()
    moved = ring_allreduce_bytes(buf.numel() * buf.element_size(), dist.get_world_size())
    state.add(moved, moved, 0.0)
    return default_hooks.allreduce_hook(None, bucket)


def is_deepspeed_engine(model: Any) -> bool:
    """A ``deepspeed.DeepSpeedEngine`` (checked without importing DeepSpeed when nobody did)."""
    ds = sys.modules.get("deepspeed")
    engine_cls = getattr(getattr(getattr(ds, "runtime", None), "engine", None), "DeepSpeedEngine", None)
    return engine_cls is not None and isinstance(model, engine_cls)


class AccelerateSynchronizer(Synchronizer):
    """:class:`Synchronizer` for a model prepared by an ``accelerate.Accelerator``.

    When Accelerate's DeepSpeed plugin prepared the model (a ``DeepSpeedEngine``), constructing
    this class returns a :class:`gossip_accel.sync.integrations.deepspeed.DeepSpeedSynchronizer` on
    that engine instead (same calls: ``step`` after ``opt.step()``, ``finalize``, ``state_dict``).
    """

    def __new__(cls, accelerator: Any, model: torch.nn.Module, config: Any = None,
                overrides: Sequence[str] = (), process_group: Optional[dist.ProcessGroup] = None):
        if is_deepspeed_engine(model):
            from .deepspeed import DeepSpeedSynchronizer

            sync = DeepSpeedSynchronizer(model, config, overrides, process_group)
            sync.accelerator = accelerator
            return sync  # not an AccelerateSynchronizer: Python does not run __init__ on it again
        if cls is AccelerateSynchronizer and _hierarchical(config, overrides, process_group):
            cls = AccelerateHierarchicalSynchronizer  # sync.hierarchy (a subclass: __init__ runs on it)
        return super().__new__(cls)

    def __init__(
        self,
        accelerator: Any,
        model: torch.nn.Module,
        config: Any = None,
        overrides: Sequence[str] = (),
        process_group: Optional[dist.ProcessGroup] = None,
    ):
        self.accelerator = accelerator
        check_accelerate_world(accelerator, process_group)
        super().__init__(accelerator.unwrap_model(model), config, overrides, process_group)
        for optimizer in getattr(accelerator, "_optimizers", ()):  # the prepared ones: step() once per step
            self.watch(optimizer)
        if isinstance(model, DistributedDataParallel) and self.cfg.enabled:
            register_hook_once(model, *self.ddp_comm_hook())
            if self.gradient_warmup is not None:  # sync.warmup_kind=gradients: DDP's all-reduce in the hook
                self.gradient_warmup.via_ddp = True
            if self.cfg.buffers != "broadcast":
                # torch >= 2.14 reads forward_sync_buffers; older releases broadcast_buffers
                for flag in ("forward_sync_buffers", "broadcast_buffers"):
                    if hasattr(model, flag):
                        setattr(model, flag, False)

    def ddp_comm_hook(self) -> tuple[Any, Any]:
        """(state, hook) registered on the DDP model: no gradient all-reduce at all (a gradient warm-up:
        DDP's all-reduce for its steps, :func:`gossip_accel.sync.warmup.warmup_ddp_hook`)."""
        if self.gradient_warmup is not None:
            return self.gradient_warmup, warmup_ddp_hook
        return None, noop_allreduce_hook

    def step(self) -> None:
        """Count an optimizer step only when Accelerate really stepped (gradient accumulation)."""
        if getattr(self.accelerator, "sync_gradients", True):
            super().step()


def ddp_wrapper_needed(accelerator: Any, cfg: Any) -> Optional[str]:
    """Why a run of this sync config needs DDP's wrapper around the model, or None where the synchronizer
    needs nothing of it: with its no-op hook DDP communicates nothing, yet it still copies every gradient into
    its buckets and back at each backward (+23% step time of a 10M-parameter model on 2 CPU cores,
    docs/RESULTS.md "Where a worker's time goes"). Needed for DDP itself (``sync.enabled=false``), DeepSpeed,
    ``sync.hierarchy`` (DDP all-reduces inside each group) and ``sync.buffers=broadcast`` (DDP's per-forward
    broadcast of rank 0's buffers). A gradient warm-up averages in optimizer pre-hooks without it."""
    cfg = load_sync_config(cfg)
    if not cfg.enabled:
        return "sync.enabled=false: DDP's gradient all-reduce is the training"
    if getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None) is not None:
        return "DeepSpeed prepares its own engine"
    if _hierarchical(cfg, (), None):
        return "sync.hierarchy: DDP all-reduces the gradients inside each group"
    if cfg.buffers == "broadcast":
        return "sync.buffers=broadcast: DDP broadcasts rank 0's buffers at every forward"
    return None


def prepare(accelerator: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any,
            wrap: Optional[bool] = None) -> tuple[torch.nn.Module, Any]:
    """``accelerator.prepare(model, optimizer)`` for a run synchronized by ``cfg``: the model without DDP's
    wrapper (``prepare_model(evaluation_mode=True)``: device placement and mixed precision only) where
    :func:`ddp_wrapper_needed` finds no use for it, wrapped as usual otherwise; ``wrap=True`` wraps it
    anyway, ``wrap=False`` refuses a run that needs the wrapper."""
    needed = ddp_wrapper_needed(accelerator, cfg)
    if wrap is False and needed is not None:
        raise ConfigError(f"the model must be wrapped in DDP: {needed}")
    if wrap or needed is not None:
        return accelerator.prepare(model, optimizer)
    return accelerator.prepare_model(model, evaluation_mode=True), accelerator.prepare_optimizer(optimizer)


def check_accelerate_world(accelerator: Any, process_group: Optional[dist.ProcessGroup] = None) -> None:
    """Accelerate must see the processes torch.distributed has: ``Accelerator()`` on CPU workers under
    ``accelerate launch --multi_gpu`` or torchrun believes it is alone (every rank then trains on the
    same data) while the process group holds every worker."""
    n = getattr(accelerator, "num_processes", None)
    if process_group is not None or n is None or not (dist.is_available() and dist.is_initialized()):
        return
    world = dist.get_world_size()
    if n != world:
        kind = getattr(getattr(accelerator, "distributed_type", None), "value", "?")
        raise ConfigError(
            f"Accelerate runs {n} process(es) (distributed_type {kind}) but torch.distributed has {world}: each rank "
            "would load the whole data set as if alone; create the Accelerator with Accelerator(cpu=True) for CPU "
            "workers (or launch with accelerate launch / torchrun so that Accelerate sees every process)")


def register_hook_once(model: DistributedDataParallel, state: Any, hook: Any) -> None:
    """``model.register_comm_hook(state, hook)``, or nothing if an earlier synchronizer registered the same
    hook on this model; another hook already there is a :class:`UsageError` (torch allows one)."""
    if model in _HOOKED:
        if _HOOKED[model] is hook and state is None:
            return  # the no-op hook of an earlier (finalized) synchronizer: still right
        raise UsageError("this DDP model already carries the communication hook of an earlier synchronizer "
                         f"({_HOOKED[model].__name__}); torch allows one hook per model: prepare the model again "
                         "(accelerator.prepare) for a new synchronizer")
    try:
        model.register_comm_hook(state=state, hook=hook)
    except RuntimeError as e:
        if "only be called once" not in str(e):
            raise
        raise UsageError("this DDP model already has a communication hook (register_comm_hook was called on it "
                         "before): the synchronizer registers its own (gradients stay local); prepare the model "
                         "without one") from e
    _HOOKED[model] = hook


def _hierarchical(config: Any, overrides: Sequence[str], process_group: Optional[dist.ProcessGroup]) -> bool:
    return process_group is None and resolved_group_size(load_sync_config(config, overrides)) > 1


class AccelerateHierarchicalSynchronizer(AccelerateSynchronizer, HierarchicalSynchronizer):
    """``sync.hierarchy`` under Accelerate (what :class:`AccelerateSynchronizer` builds when the
    hierarchy resolves to groups of g > 1 ranks): DDP's gradient all-reduce runs inside the group
    (torch's ``allreduce_hook`` on the group's process group), the components between groups."""

    ddp_comm_hook = HierarchicalSynchronizer.ddp_comm_hook
