"""ASR training data: Kaldi feats.scp + text -> length-sorted batches with a frame budget.

Batching by length (as Kaldi, ESPnet and icefall do): utterances are sorted by number of
frames and cut into batches whose padded size (longest utterance x batch size) stays within
``max_frames``; the order of the batches is shuffled per epoch with a seed. Every rank builds
the same global list of batches and takes every n-th one, so the split is deterministic and
needs no communication; ranks may still end up with different counts (the global count is not
a multiple of n, or data differ per rank), so the training loop agrees on the number of steps
with one all-reduce per epoch (:func:`gossip_accel.train.collectives.agree_on_steps`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from .kaldi.tables import read_table, refuse_commands


@dataclass
class Utterance:
    utt: str
    feats: str  # kaldiio rxspecifier (ark path:offset)
    frames: int
    tokens: list[int]


def load_utterances(
    data_dir: Path, encode: Callable[[str], list[int]], max_frames_per_utt: Optional[int] = None
) -> tuple[list[Utterance], dict[str, int]]:
    """Utterances that have features, frames and a non-empty transcript.

    Returns them with a report of what was left out and why (never silently).
    """
    data_dir = Path(data_dir)
    for f in ("feats.scp", "utt2num_frames", "text"):
        if not (data_dir / f).is_file():
            raise FileNotFoundError(f"{data_dir / f} not found: run the feature stage for {data_dir} first")
    refuse_commands(data_dir / "feats.scp", "feats.scp must name archives (file.ark:offset); "
                                            "recompute it with gossip_accel.bin.compute_fbank")
    feats, frames, text = (read_table(data_dir / f) for f in ("feats.scp", "utt2num_frames", "text"))
    dropped = {"no_text": 0, "empty_tokens": 0, "too_long": 0, "too_short_for_ctc": 0}
    utts = []
    for utt, spec in feats.items():
        if utt not in text or utt not in frames:
            dropped["no_text"] += 1
            continue
        tokens = encode(text[utt])
        n = int(frames[utt])
        if not tokens:
            dropped["empty_tokens"] += 1
        elif max_frames_per_utt and n > max_frames_per_utt:
            dropped["too_long"] += 1
        elif n < len(tokens):  # CTC needs at least one frame per label (before subsampling)
            dropped["too_short_for_ctc"] += 1
        else:
            utts.append(Utterance(utt, spec, n, tokens))
    if not utts:
        raise ValueError(f"{data_dir}: no usable utterance ({dropped})")
    return utts, dropped


def make_batches(utts: Sequence[Utterance], max_frames: int) -> list[list[Utterance]]:
    """Length-sorted batches whose padded frame count stays within ``max_frames``."""
    batches, cur = [], []
    for u in sorted(utts, key=lambda u: (u.frames, u.utt)):
        if cur and u.frames * (len(cur) + 1) > max_frames:
            batches.append(cur)
            cur = []
        cur.append(u)
    if cur:
        batches.append(cur)
    return batches


def epoch_batches(batches: Sequence[list[Utterance]], epoch: int, seed: int, rank: int, world: int,
                  shuffle: bool = True, start: int = 0) -> list[list[Utterance]]:
    """This rank's batches of an epoch: a seeded shuffle of the global list, every n-th one.

    ``start``: the first ``start`` batches of the shuffled list are left out. After n workers ran
    d batches each, they consumed exactly the first n x d (rank r ran r, r + n, ...), so an elastic
    resume on m workers continues with ``start`` = n x d (summed over the epoch's segments)."""
    order = list(range(len(batches)))
    if shuffle:
        random.Random(seed * 100_003 + epoch).shuffle(order)
    return [batches[i] for i in order[start:][rank::world]]


def collate(batch: Sequence[Utterance], norm: Optional[Callable[[torch.Tensor, str], torch.Tensor]] = None,
            perturb: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> dict:
    """Padded features (B, T, D), each changed by ``perturb`` (e.g. :func:`vtlp`) and then normalized by ``norm``
    (a :class:`~.cmvn.FeatureNorm`, given the features and the utterance id), their lengths, concatenated targets and target lengths."""
    from .cmvn import load_feats

    feats = [torch.tensor(load_feats(u.feats, u.utt), dtype=torch.float32) for u in batch]
    if perturb is not None:
        feats = [perturb(f) for f in feats]
    if norm is not None:
        feats = [norm(f, u.utt) for f, u in zip(feats, batch)]
    lengths = torch.tensor([f.shape[0] for f in feats])
    x = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    targets = torch.tensor([t for u in batch for t in u.tokens], dtype=torch.long)
    target_lengths = torch.tensor([len(u.tokens) for u in batch])
    return {"utts": [u.utt for u in batch], "feats": x, "lengths": lengths, "targets": targets,
            "target_lengths": target_lengths}


def spec_augment(x: torch.Tensor, lengths: torch.Tensor, freq_masks: int, freq_width: int,
                 time_masks: int, time_width: int, generator: torch.Generator) -> torch.Tensor:
    """SpecAugment (Park et al. 2019) without time warping: zero random bands of (B, T, D)."""
    x = x.clone()
    b, _, d = x.shape
    for i in range(b):
        n = int(lengths[i])
        for _ in range(freq_masks):
            w = int(torch.randint(0, freq_width + 1, (1,), generator=generator))
            f0 = int(torch.randint(0, max(1, d - w), (1,), generator=generator))
            x[i, :, f0:f0 + w] = 0
        for _ in range(time_masks):
            w = int(torch.randint(0, min(time_width, max(1, n // 5)) + 1, (1,), generator=generator))
            t0 = int(torch.randint(0, max(1, n - w), (1,), generator=generator))
            x[i, t0:t0 + w, :] = 0
    return x


def vtlp(feats: torch.Tensor, warp: float, sample_rate: float = 16000.0, low_freq: float = 20.0,
         high_freq: float = 0.0, vtln_low: float = 100.0, vtln_high: float = -500.0) -> torch.Tensor:
    """Vocal tract length perturbation (Jaitly & Hinton 2013) of log-mel features (T, D) by the factor ``warp``.

    Each mel bin is moved as Kaldi's VTLN moves its filter (``torchaudio.compliance.kaldi.vtln_warp_freq``: the
    bin centred at f reads the spectrum at F(f) = f / warp between the two inflection points, piecewise linear
    to the edges) and its value is interpolated linearly between the neighbouring bins of ``feats``. The
    frequencies are those of the fbank that made ``feats`` (``high_freq``/``vtln_high`` <= 0: offsets from the
    Nyquist frequency, as in Kaldi); warp 1 returns ``feats`` unchanged."""
    from torchaudio.compliance.kaldi import inverse_mel_scale, mel_scale, vtln_warp_freq

    if warp == 1.0:
        return feats
    nyquist = sample_rate / 2
    high = high_freq if high_freq > 0 else nyquist + high_freq
    d = feats.shape[-1]
    mel_low, mel_high = mel_scale(torch.tensor(low_freq)), mel_scale(torch.tensor(high))
    step = (mel_high - mel_low) / (d + 1)
    centres = mel_low + step * torch.arange(1, d + 1, dtype=torch.float64)
    moved = vtln_warp_freq(vtln_low, vtln_high if vtln_high > 0 else nyquist + vtln_high, low_freq, high, warp,
                           inverse_mel_scale(centres))
    pos = ((mel_scale(moved) - mel_low) / step - 1).clamp(0, d - 1)
    lo = pos.floor().long().clamp(max=d - 2)
    frac = (pos - lo).to(feats.dtype)
    return feats[..., lo] * (1 - frac) + feats[..., lo + 1] * frac
