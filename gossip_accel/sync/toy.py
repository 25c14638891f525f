"""A small deterministic regression task used by the simulator's CLI and by the tests.

The model has an embedding (to exercise row sharding), linear layers and a BatchNorm (to
exercise the buffer policy). Worker k's mini-batch at step t is a pure function of
(seed, k, t), so a distributed run and the simulator see exactly the same data.
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB, CONTEXT, EMB, HIDDEN = 40, 4, 8, 32

TOY_COMPONENTS = [
    {"name": "embedding", "pattern": r"^embedding\.", "period": 8, "shards": 2},
    {"name": "rest"},
]


class ToyModel(nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embedding = nn.Embedding(VOCAB, EMB)
        self.hidden = nn.Linear(CONTEXT * EMB, HIDDEN)
        self.norm = nn.BatchNorm1d(HIDDEN)
        self.out = nn.Linear(HIDDEN, 1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embedding(ids).flatten(1)
        return self.out(torch.tanh(self.norm(self.hidden(h)))).squeeze(-1)


def _teacher(ids: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    table = torch.randn(VOCAB, generator=g)
    w = torch.linspace(1.0, 0.25, CONTEXT)
    return torch.sin((table[ids] * w).sum(-1) * 2.0)


def batch(seed: int, rank: int, step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker ``rank``'s mini-batch at ``step``: ids (size, CONTEXT) and targets (size,)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    ids = torch.randint(0, VOCAB, (size, CONTEXT), generator=g)
    return ids, _teacher(ids)


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, seed: int, rank: int, step: int, accum: int = 1
) -> float:
    """One local optimizer step (Algorithm 1, lines 3-5) on worker ``rank``'s data.

    With ``accum > 1`` the step accumulates gradients of micro-batches
    ``(step-1)*accum+1 .. step*accum``. Returns the mean loss.
    """
    opt.zero_grad(set_to_none=True)
    total = backward(model, seed, rank, step, accum)
    opt.step()
    return total


def backward(model: nn.Module, seed: int, rank: int, step: int, accum: int = 1) -> float:
    """The gradients of :func:`train_step` (accumulated into .grad), without the optimizer step; the mean loss."""
    total = 0.0
    for micro in range((step - 1) * accum + 1, step * accum + 1):
        ids, y = batch(seed, rank, micro)
        loss = torch.nn.functional.mse_loss(model(ids), y) / accum
        loss.backward()
        total += float(loss.detach())
    return total


@torch.no_grad()
def heldout_loss(model: nn.Module, seed: int = 99) -> float:
    was = model.training
    model.eval()
    ids, y = batch(seed, rank=10_000, step=0, size=512)
    out = float(torch.nn.functional.mse_loss(model(ids), y))
    model.train(was)
    return out
