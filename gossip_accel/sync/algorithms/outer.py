"""Any torch optimizer as the outer (block) optimizer of a component (``sync.outer_optimizer``).

Per component, the block's start model p (the model every worker began the block from) and a
torch optimizer over p. At a sync, with theta_bar the (neighbourhood) average of line 8 of
Algorithm 1 of 000_07fa007f7f1023ae.txt:

    g = p - theta_bar      (the outer gradient: -G of line 10)
    p = opt.step(p, g)     (the outer optimizer's step)
    theta = p              (the new local model; the next block starts from it)

``torch.optim.SGD(lr=zeta, momentum=eta, dampening=0, nesterov=True)`` is exactly BMUF-NBM
(lines 10-13) and ``nesterov=False`` is CBM (eq. 3-5 of 001_3db6b3ddf1f13045.txt): with
p = omega + eta Delta (NBM) or omega (CBM), SGD's momentum buffer is -Delta / zeta
(docs/ALGORITHMS.md, "Outer optimizers"; tests/test_algorithms.py checks it). DiLoCo
(arXiv 2311.08105) is Nesterov SGD with lr 0.7, momentum 0.9.

Pure tensors: no I/O, no torch.distributed.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping, Optional

import torch


def optimizer_class(name: Any) -> type:
    """The ``torch.optim`` optimizer class called ``name`` (e.g. ``SGD``, ``Adam``); ValueError otherwise."""
    cls = getattr(torch.optim, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or cls is torch.optim.Optimizer:
        known = sorted(n for n, c in vars(torch.optim).items()
                       if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer)
        raise ValueError(f"name={name!r} is not a torch.optim optimizer; choose one of {', '.join(known)}")
    return cls


def unknown_kwargs(cls: type, kwargs: Mapping[str, Any]) -> list[str]:
    """The keys of ``kwargs`` that ``cls``'s constructor does not take (besides the parameters)."""
    sig = inspect.signature(cls.__init__)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return []
    return [k for k in kwargs if k not in sig.parameters or k in ("self", "params")]


def make_optimizer(spec: Mapping[str, Any], p: torch.Tensor) -> torch.optim.Optimizer:
    """``torch.optim.<spec['name']>([p], **other keys of spec)``."""
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    return optimizer_class(spec.get("name"))([p], **kwargs)


class OuterSlots:
    """The slots of one component under an outer optimizer: p (fp32 start model of the block) and the
    optimizer over it. p.grad is set only during :func:`outer_update` (it borrows theta_bar's buffer)."""

    def __init__(self, p: torch.Tensor, spec: Mapping[str, Any]):
        self.p = p
        self.spec = dict(spec)
        self.optimizer = make_optimizer(self.spec, p)

    @classmethod
    def start_from(cls, theta: torch.Tensor, spec: Mapping[str, Any],
                   device: torch.device | str | None = None) -> "OuterSlots":
        """p <- theta_0 (an fp32 copy on ``device``) and a fresh optimizer (Algorithm 1, line 1)."""
        p = theta.detach().to(device=device or theta.device, dtype=torch.float32, copy=True)
        return cls(p, spec)

    @property
    def device(self) -> torch.device:
        return self.p.device

    def tensors(self) -> list[torch.Tensor]:
        """p and every tensor of the optimizer's state (what a non-finite check looks at)."""
        return [self.p] + [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]

    def restart(self, theta_bar: torch.Tensor) -> None:
        """p <- theta_bar and a fresh optimizer state (warm-up end, a non-finite reset: line 1 again)."""
        self.p.copy_(theta_bar)
        self.optimizer = make_optimizer(self.spec, self.p)

    def state_dict(self) -> dict:
        """p and the optimizer's state on the CPU (tensors and plain values: loadable with weights_only)."""
        def cpu(v):
            if torch.is_tensor(v):
                return v.detach().cpu().clone()
            if isinstance(v, dict):
                return {k: cpu(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return type(v)(cpu(x) for x in v)
            return v

        return {"p": cpu(self.p), "optimizer": cpu(self.optimizer.state_dict())}

    def load_state_dict(self, state: dict) -> None:
        self.p.copy_(state["p"])
        self.optimizer = make_optimizer(self.spec, self.p)
        self.optimizer.load_state_dict(state["optimizer"])  # casts the state to p's device


def outer_update(theta_bar: torch.Tensor, slots: OuterSlots) -> torch.Tensor:
    """One outer step on a component, in place; returns the new local model p (module docstring).

    ``theta_bar`` (float32, on the slots' device) is overwritten: it holds the outer gradient
    g = p - theta_bar during the step and the new model after it, so a sync allocates nothing
    beyond the optimizer's own temporaries.
    """
    p = slots.p
    g = theta_bar.sub_(p).neg_()
    p.grad = g
    try:
        slots.optimizer.step()
    finally:
        p.grad = None
    return theta_bar.copy_(p)

