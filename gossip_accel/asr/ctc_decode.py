"""CTC decoding: greedy (best path) and prefix beam search with optional LM shallow fusion.

Inputs are log-probabilities over V outputs (blank = ``blank``, 0 by default), either one
utterance (T, V) or a batch (B, T, V) with per-utterance ``lengths`` (frames beyond a length
are padding and ignored). Outputs are token-id lists without blanks or repeats.

Prefix beam search (Hannun et al. 2014, arXiv:1408.2873) keeps for every label prefix y the
log-probabilities that the frames so far collapse to y ending in blank (``p_b``) or in a
non-blank (``p_nb``); ``P_ctc(y) = p_b + p_nb`` (log-sum). A repeated token needs a blank in
between (``a a`` extends only the blank-ending part of ``... a``). Hypotheses are ranked by

    score(y) = log P_ctc(y | x) + lm_weight * sum_i lm_score(y_<i, y_i) + insertion_bonus * |y|

where ``lm_score(prefix, token)`` is the external LM's log P(token | prefix) (prefix a tuple of
token ids, empty at the start), evaluated once per new prefix (cached). No end-of-sentence
term is added. Pruning: per frame only the ``token_topk`` most likely tokens (blank always
included) extend hypotheses, optionally only those within ``prune_threshold`` nats of the
frame's best, and the best ``beam`` prefixes survive each frame.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

LMScore = Callable[[tuple, int], float]
NEG_INF = float("-inf")


def _as_batch(log_probs: torch.Tensor, lengths: Optional[torch.Tensor | Sequence[int]]):
    """(B, T, V) tensor and (B,) lengths from a (T, V) or (B, T, V) input."""
    if log_probs.dim() == 2:
        log_probs = log_probs.unsqueeze(0)
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (T, V) or (B, T, V), got shape {tuple(log_probs.shape)}")
    b, t, _ = log_probs.shape
    if lengths is None:
        lengths = torch.full((b,), t, dtype=torch.long)
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    if lengths.numel() != b:
        raise ValueError(f"{lengths.numel()} lengths for a batch of {b}")
    if (lengths > t).any() or (lengths < 0).any():
        raise ValueError(f"lengths {lengths.tolist()} outside 0..{t} frames")
    return log_probs, lengths


def greedy_decode(log_probs: torch.Tensor, lengths: Optional[torch.Tensor | Sequence[int]] = None,
                  blank: int = 0) -> list[list[int]]:
    """Best path: argmax per frame, collapse repeats, drop blanks. One list per utterance."""
    lp, lengths = _as_batch(log_probs, lengths)
    best = lp.argmax(dim=-1).cpu()  # (B, T)
    prev = torch.cat([torch.full_like(best[:, :1], -1), best[:, :-1]], dim=1)
    keep = (best != prev) & (best != blank) & (torch.arange(best.shape[1])[None, :] < lengths[:, None])
    return [best[i][keep[i]].tolist() for i in range(best.shape[0])]


@dataclass
class Hypothesis:
    """A beam-search result; ``score`` = ``ctc_score + lm_weight * lm_score + insertion_bonus * len``."""

    tokens: tuple
    score: float
    ctc_score: float
    lm_score: float


def _lse(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


def prefix_beam_search(log_probs: torch.Tensor, length: Optional[int] = None, beam: int = 10,
                       token_topk: Optional[int] = None, blank: int = 0, lm_score: Optional[LMScore] = None,
                       lm_weight: float = 0.0, insertion_bonus: float = 0.0,
                       prune_threshold: Optional[float] = None) -> list[Hypothesis]:
    """CTC prefix beam search on one utterance's (T, V) log-probs; up to ``beam`` hypotheses, best first.

    ``token_topk`` (default ``min(V, beam + 1)``) tokens per frame are expanded, and with
    ``prune_threshold`` only those within that many nats of the frame's best token (a large
    speed-up on peaky CTC outputs; 10 to 20 changes next to nothing). ``lm_score`` is used only
    when ``lm_weight != 0``. See the module docstring for the score.
    """
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be (T, V) for one utterance, got shape {tuple(log_probs.shape)}")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    t_max, v = log_probs.shape
    t_len = t_max if length is None else int(length)
    k = min(v, token_topk if token_topk is not None else beam + 1)
    use_lm = lm_score is not None and lm_weight != 0.0
    lp = log_probs[:t_len].detach().float().cpu()
    top_lp, top_ids = lp.topk(k, dim=-1)
    top_lp, top_ids, blank_lp = top_lp.tolist(), top_ids.tolist(), lp[:, blank].tolist()

    # prefixes are nodes of a trie (int ids), so that dict keys stay cheap for long prefixes
    parent: list[int] = [-1]
    last_token: list[int] = [-1]
    length: list[int] = [0]
    lm_acc: list[float] = [0.0]  # accumulated LM log-prob of the prefix
    child: dict[tuple[int, int], int] = {}
    tuples: dict[int, tuple] = {0: ()}  # only filled when the LM needs the prefix

    def as_tuple(node: int) -> tuple:
        if node in tuples:
            return tuples[node]
        out = []
        n = node
        while n > 0:
            out.append(last_token[n])
            n = parent[n]
        return tuple(reversed(out))

    def extend(node: int, c: int) -> int:
        key = (node, c)
        n = child.get(key)
        if n is None:
            n = len(parent)
            child[key] = n
            parent.append(node)
            last_token.append(c)
            length.append(length[node] + 1)
            lm = 0.0
            if use_lm:
                prefix = tuples.get(node) or as_tuple(node)
                tuples[node] = prefix
                lm = float(lm_score(prefix, c))
            lm_acc.append(lm_acc[node] + lm)
        return n

    def total(node: int, pb: float, pnb: float) -> float:
        return _lse(pb, pnb) + lm_weight * lm_acc[node] + insertion_bonus * length[node]

    beams: dict[int, list[float]] = {0: [0.0, NEG_INF]}  # prefix node -> [log p_b, log p_nb]
    for t in range(t_len):
        nxt: dict[int, list[float]] = {}

        def slot(node: int) -> list[float]:
            s = nxt.get(node)
            if s is None:
                s = nxt[node] = [NEG_INF, NEG_INF]
            return s

        floor = top_lp[t][0] - prune_threshold if prune_threshold is not None else NEG_INF
        frame = [(c, lp_c) for c, lp_c in zip(top_ids[t], top_lp[t]) if c != blank and lp_c > NEG_INF and lp_c >= floor]
        for node, (pb, pnb) in beams.items():
            p_all = _lse(pb, pnb)
            s = slot(node)
            s[0] = _lse(s[0], p_all + blank_lp[t])  # blank: prefix unchanged, now ends in blank
            last = last_token[node]
            for c, lp_c in frame:
                if c == last:
                    s[1] = _lse(s[1], pnb + lp_c)  # "a" + "a" without blank collapses
                    p_new = pb + lp_c  # "a" blank "a" is a new token
                else:
                    p_new = p_all + lp_c
                if p_new == NEG_INF:
                    continue
                sn = slot(extend(node, c))
                sn[1] = _lse(sn[1], p_new)
        alive = [kv for kv in nxt.items() if kv[1][0] > NEG_INF or kv[1][1] > NEG_INF] or list(nxt.items())
        scored = [(total(n, pb, pnb), n) for n, (pb, pnb) in alive]
        if len(scored) > beam:
            scored = heapq.nlargest(beam, scored)
        beams = {n: nxt[n] for _, n in scored}
    out = [Hypothesis(as_tuple(n), total(n, pb, pnb), _lse(pb, pnb), lm_acc[n]) for n, (pb, pnb) in beams.items()]
    out.sort(key=lambda h: (-h.score, h.tokens))
    return out


def beam_search_decode(log_probs: torch.Tensor, lengths: Optional[torch.Tensor | Sequence[int]] = None,
                       beam: int = 10, **kwargs) -> list[list[int]]:
    """Best hypothesis of :func:`prefix_beam_search` for each utterance of a (B, T, V) batch."""
    lp, lengths = _as_batch(log_probs, lengths)
    return [list(prefix_beam_search(lp[i], int(lengths[i]), beam=beam, **kwargs)[0].tokens)
            for i in range(lp.shape[0])]
