"""Blockwise model-update filtering (BMUF) with classic or Nesterov block momentum.

Notation of the project (shared/papers/README.md): eta = block momentum, zeta = block
learning rate. In 001_3db6b3ddf1f13045.txt the same equations read with the letters swapped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BMUFSlots:
    """Per-component slots of Algorithm 1: omega (global model) and Delta (filtered update).

    Both have the shape of the component's flat vector; G needs no slot of its own here
    because it is formed in the caller's work buffer.
    """

    omega: torch.Tensor
    delta: torch.Tensor

    @classmethod
    def start_from(cls, theta: torch.Tensor, device: torch.device | str | None = None) -> "BMUFSlots":
        """omega <- theta_0, Delta <- 0 (Algorithm 1, line 1)."""
        omega = theta.detach().to(device=device or theta.device, dtype=torch.float32, copy=True)
        return cls(omega=omega, delta=torch.zeros_like(omega))

    @property
    def device(self) -> torch.device:
        return self.omega.device

    def tensors(self) -> list[torch.Tensor]:
        """omega and Delta (what a non-finite check looks at)."""
        return [self.omega, self.delta]

    def restart(self, theta_bar: torch.Tensor) -> None:
        """omega <- theta_bar, Delta <- 0 (warm-up end, a non-finite reset: line 1 again)."""
        self.omega.copy_(theta_bar)
        self.delta.zero_()

    def state_dict(self) -> dict:
        return {"omega": self.omega.detach().cpu().clone(), "delta": self.delta.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        self.omega.copy_(state["omega"])
        self.delta.copy_(state["delta"])


def bmuf_update(
    theta_bar: torch.Tensor,
    slots: BMUFSlots,
    block_momentum: float,
    block_lr: float,
    nesterov: bool = True,
) -> torch.Tensor:
    """One BMUF step on a component, in place; returns the new local model.

    With eta = ``block_momentum`` and zeta = ``block_lr`` (Algorithm 1 of
    000_07fa007f7f1023ae.txt, lines 10-13; eq. 3-5 of 001_3db6b3ddf1f13045.txt):

        theta_start = omega + eta * Delta   (NBM: where the block started; CBM: omega)
        G     = theta_bar - theta_start            (line 10, eq. 5)
        Delta = eta * Delta + zeta * G             (line 11, eq. 4)
        omega = omega + Delta                      (line 12, eq. 3)
        theta = omega + eta * Delta   (NBM)   or   omega   (CBM)        (line 13)

    ``theta_bar`` (float32, same device as the slots) is overwritten: it holds G and then
    the returned new local model, so a sync allocates nothing.
    """
    eta, zeta = block_momentum, block_lr
    g = theta_bar.sub_(slots.omega)
    if nesterov:
        g.sub_(slots.delta, alpha=eta)
    slots.delta.mul_(eta).add_(g, alpha=zeta)
    slots.omega.add_(slots.delta)
    if nesterov:
        return torch.add(slots.omega, slots.delta, alpha=eta, out=theta_bar)
    return theta_bar.copy_(slots.omega)


def block_momentum_from_rule(n: int, block_lr: float = 1.0, c: float = 1.0) -> float:
    """eta such that zeta * n * (1 - eta) = C (eq. 6 of 001, letters in project notation)."""
    return max(0.0, 1.0 - c / (n * block_lr))
