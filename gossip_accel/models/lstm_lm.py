"""LSTMP language model with an adaptive softmax (section 3.2 of 000_07fa007f7f1023ae.txt).

Embedding -> dropout -> LSTM with a recurrent projection (LSTMP, torch's ``proj_size``) ->
dropout -> adaptive softmax (Grave et al.; ``div_value`` is the tail projection factor).
The forget-gate bias starts at 1.0. Parameter names, for sync.components rules:
``embedding.weight``; ``lstm.weight_ih_l*``, ``lstm.weight_hh_l*``, ``lstm.bias_*`` (LSTM);
``lstm.weight_hr_l*`` (projection); ``softmax.head.*``; ``softmax.tail.<j>.*`` (tail j).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn


def frequency_cutoffs(counts: Sequence[int], head_size: int, num_tails: int) -> list[int]:
    """Adaptive-softmax cutoffs: a head of ``head_size`` ids, then tails of equal frequency mass.

    ``counts`` are per-id training counts of a frequency-sorted vocabulary.
    """
    v = len(counts)
    head_size = min(head_size, v - num_tails)
    if num_tails < 1 or head_size < 1:
        raise ValueError(f"vocabulary of {v} words is too small for {num_tails} tails")
    rest = counts[head_size:]
    total = float(sum(rest)) or 1.0
    cutoffs, acc, k = [head_size], 0.0, 1
    for i, c in enumerate(rest):
        acc += c
        if k < num_tails and acc >= total * k / num_tails and head_size + i + 1 < v:
            cut = head_size + i + 1
            if cut > cutoffs[-1]:
                cutoffs.append(cut)
                k += 1
    return cutoffs


class LSTMPLanguageModel(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        cutoffs: Sequence[int],
        embedding_dim: int = 512,
        hidden_size: int = 2048,
        projection_size: int = 512,
        num_layers: int = 1,
        dropout: float = 0.1,
        div_value: float = 2.0,
        forget_bias: float = 1.0,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers=num_layers,
                            proj_size=projection_size, batch_first=True)
        self.softmax = nn.AdaptiveLogSoftmaxWithLoss(projection_size, vocab_size, list(cutoffs), div_value=div_value)
        with torch.no_grad():
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias_"):
                    p.zero_()
                    if name.startswith("bias_ih"):
                        p[hidden_size:2 * hidden_size] = forget_bias  # gate order i, f, g, o

    def forward(
        self, ids: torch.Tensor, targets: torch.Tensor, state: Optional[tuple] = None
    ) -> tuple[torch.Tensor, tuple]:
        """Mean negative log-likelihood of ``targets`` (B, T) and the new recurrent state."""
        h, state = self.lstm(self.drop(self.embedding(ids)), state)
        out = self.softmax(self.drop(h).reshape(-1, h.shape[-1]), targets.reshape(-1))
        return out.loss, state
