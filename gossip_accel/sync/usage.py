"""Misuse of the training-loop API, refused or warned (docs/RELIABILITY.md, "Misuse").

* **One synchronizer per model** (:func:`claim`): a second live synchronizer on the same module
  would synchronize it twice per step (and DDP accepts one communication hook only); one that
  was finalized or closed releases its model.
* **``step()`` after ``finalize()``** (:func:`refuse_step_after_finalize`): the replicas were
  averaged (Algorithm 1, line 20) and the engine is done; further syncs would leave them apart.
* **``step()`` once per optimizer step** (:class:`StepWatch`): with the optimizer known (it is
  given to :meth:`~gossip_accel.sync.synchronizer.Synchronizer.watch`, which
  ``SyncedOptimizer`` and ``AccelerateSynchronizer`` call), a torch step post-hook counts the
  optimizer's steps; a ``step()`` with none since the previous one (called twice, or before the
  optimizer's first step) or with several (calls missed) warns once per kind. A warning, not an
  error: a GradScaler that skips an overflowing step calls no optimizer step either, and every
  rank must still count it (the ranks' step counters drive the same collectives).
"""
from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any, Optional

import torch


class UsageError(RuntimeError):
    """The training loop used the synchronizer in a way that cannot give the right result."""


class UsageWarning(RuntimeWarning):
    """The training loop probably misuses the synchronizer (see :class:`StepWatch`)."""


#: id(module) -> the live synchronizer that owns it
_OWNERS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def _owner(module: torch.nn.Module) -> Optional[Any]:
    sync = _OWNERS.get(id(module))
    if sync is None or getattr(sync, "released", True) or sync.owned_module() is not module:
        return None
    return sync


def claim(module: torch.nn.Module, sync: Any) -> None:
    """Make ``sync`` the owner of ``module``; :class:`UsageError` if another live one owns it."""
    other = _owner(module)
    if other is not None and other is not sync:
        gc.collect()  # an unreferenced synchronizer in a reference cycle is not gone until collected
        other = _owner(module)
    if other is not None and other is not sync:
        raise UsageError(
            f"this model already has a live {type(other).__name__} (step {other.t}): build one synchronizer per "
            "model (a second would synchronize it twice per step); finalize() or close() the first one before "
            "building another")
    _OWNERS[id(module)] = sync


def release(module: torch.nn.Module, sync: Any) -> None:
    if _OWNERS.get(id(module)) is sync:
        del _OWNERS[id(module)]


def refuse_step_after_finalize(sync: Any) -> None:
    if sync.finalized:
        raise UsageError(
            f"{type(sync).__name__}.step() after finalize() (the end of its with block, step {sync.t}): the replicas "
            "were averaged and the synchronizer is finished; call step() inside the with block, once per optimizer "
            "step, or build a new synchronizer to train on")


def inner_optimizer(optimizer: Any) -> Optional[torch.optim.Optimizer]:
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` (itself an Optimizer subclass) or a
    ``SyncedOptimizer``: followed through ``.optimizer`` as long as that is a torch optimizer; None if none."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


class StepWatch:
    """Counts the steps of the watched optimizers between two ``Synchronizer.step()`` calls."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}      # id(optimizer) -> optimizer steps since the last check
        self.names: dict[int, str] = {}
        self.handles: list = []
        self.warned: set[str] = set()

    def watch(self, optimizer: Any) -> bool:
        """Count ``optimizer``'s steps (a torch optimizer, or a wrapper with ``.optimizer``);
        False when it has no step hooks (nothing is checked for it)."""
        inner = inner_optimizer(optimizer)
        if inner is None or id(inner) in self.steps:
            return id(inner) in self.steps
        key = id(inner)
        self.steps[key] = 0
        self.names[key] = type(inner).__name__

        def counted(opt, args, kwargs) -> None:
            self.steps[key] = self.steps.get(key, 0) + 1

        self.handles.append(inner.register_step_post_hook(counted))
        return True

    def check(self, t: int) -> None:
        """At ``Synchronizer.step()`` number ``t``: warn if an optimizer took no step or several."""
        for key, n in self.steps.items():
            if n == 0:
                kind = "none"
                what = (f"step() number {t} came with no {self.names[key]} step since the previous one: step() is "
                        "called twice per optimizer step, or before opt.step(); call it once, after opt.step() "
                        "(a step skipped by a GradScaler is fine)")
            elif n > 1:
                kind = "several"
                what = (f"step() number {t} came after {n} {self.names[key]} steps: step() was not called after "
                        "every optimizer step, so every sync period is stretched; call it once after each opt.step()")
            else:
                continue
            if kind not in self.warned:
                self.warned.add(kind)
                warnings.warn(f"gossip_accel: {what} (warned once)", UsageWarning, stacklevel=4)
        for key in self.steps:
            self.steps[key] = 0

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.steps.clear()
