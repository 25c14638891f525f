"""CMVN statistics of Kaldi feature archives and the normalization a model sees, importable without torch
(``compute_cmvn`` runs on numpy and kaldiio; torch is imported where tensors are made).

Stats use Kaldi's layout, a (2, dim + 1) double matrix: row 0 holds the sum of every dimension and the
frame count in the last column, row 1 the sum of squares (and 0): one for the training set (``cmvn.ark``,
global) and one per speaker of each set (``cmvn_spk.ark``, Kaldi's ``cmvn.scp``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

import numpy as np

from .kaldi.tables import DataDirError, is_command, read_table

if TYPE_CHECKING:
    import torch


def load_feats(spec: str, where: str = "") -> np.ndarray:
    """The feature matrix of a ``feats.scp`` value (``file.ark:offset`` or a path) with kaldiio,
    refusing values that kaldiio would run as shell commands (``... |``): nothing in
    gossip_accel executes text from a data file. ``where`` (e.g. ``data/x/feats.scp: utt``)
    prefixes the error."""
    import kaldiio

    if is_command(spec):
        raise DataDirError(f"{where or 'feature specifier'}: {spec!r} is a shell command; feats.scp must "
                           f"name archives (file.ark:offset): recompute it with gossip_accel.bin.compute_fbank")
    return kaldiio.load_mat(spec)


def accumulate_cmvn_stats(mats: Iterable[np.ndarray], stats: Optional[np.ndarray] = None) -> np.ndarray:
    """Add feature matrices (frames, dim) to Kaldi-layout CMVN stats, a (2, dim + 1) float64 matrix."""
    for i, m in enumerate(mats):
        m = np.asarray(m, dtype=np.float64)
        if m.ndim != 2:
            raise ValueError(f"feature matrix {i} has shape {m.shape}, expected (frames, dim)")
        if stats is None:
            stats = np.zeros((2, m.shape[1] + 1), dtype=np.float64)
        if m.shape[1] != stats.shape[1] - 1:
            raise ValueError(f"feature matrix {i} has dim {m.shape[1]}, earlier ones {stats.shape[1] - 1}")
        stats[0, :-1] += m.sum(axis=0)
        stats[1, :-1] += np.square(m).sum(axis=0)
        stats[0, -1] += m.shape[0]
    if stats is None:
        raise ValueError("no feature matrices to accumulate CMVN statistics from")
    return stats


def load_global_cmvn(path: str | Path, var_floor: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) float32 tensors of shape (dim,) from Kaldi-layout CMVN stats.

    ``path`` holds one (2, dim + 1) matrix (as :mod:`gossip_accel.bin.compute_cmvn` or Kaldi's
    ``compute-cmvn-stats scp:feats.scp global.cmvn`` write it), or an archive of per-speaker
    stats, which are summed. The variance is floored at ``var_floor``. Normalize with
    ``(feats - mean) / std``.
    """
    import kaldiio

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run gossip_accel.bin.compute_cmvn on the training data dir")
    if is_command(str(path)):
        raise ValueError(f"{path}: a shell command, not a CMVN stats file; give the file written by compute_cmvn")
    try:
        stats = np.asarray(kaldiio.load_mat(str(path)), dtype=np.float64)
    except Exception:
        try:
            mats = list(kaldiio.load_ark(str(path)))
        except Exception as e:
            raise ValueError(f"{path}: not a Kaldi CMVN stats matrix or archive ({e})") from None
        if not mats:
            raise ValueError(f"{path}: empty archive, expected CMVN stats") from None
        stats = sum(np.asarray(m, dtype=np.float64) for _, m in mats)
    return cmvn_mean_std(stats, str(path), var_floor)


def cmvn_mean_std(stats: np.ndarray, where: str, var_floor: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) float32 tensors of one Kaldi-layout (2, dim + 1) stats matrix; ``where`` names it in errors."""
    if stats.ndim != 2 or stats.shape[0] != 2 or stats.shape[1] < 2:
        raise ValueError(f"{where}: CMVN stats must be a (2, dim + 1) matrix, got shape {stats.shape}")
    count = stats[0, -1]
    if count <= 0:
        raise ValueError(f"{where}: CMVN stats have frame count {count}")
    mean = stats[0, :-1] / count
    var = np.maximum(stats[1, :-1] / count - mean ** 2, var_floor)
    import torch

    return torch.from_numpy(mean).float(), torch.from_numpy(np.sqrt(var)).float()


SPEAKER_CMVN = "cmvn_spk.ark"   # a data dir's per-speaker stats (compute_cmvn --per-speaker; Kaldi's cmvn.scp)


def load_speaker_cmvn(data_dir: str | Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """utt -> (mean, std) of its speaker's features, from ``<data_dir>/cmvn_spk.ark`` and ``utt2spk``: the
    statistics Kaldi's ``apply-cmvn --utt2spk`` normalizes each utterance with (written by
    ``compute_cmvn --per-speaker``, the recipes' stage 2)."""
    import kaldiio

    data_dir = Path(data_dir)
    path = data_dir / SPEAKER_CMVN
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: data.speaker_cmvn=true needs each data dir's per-speaker stats: "
                                f"python -m gossip_accel.bin.compute_cmvn --data {data_dir} --per-speaker "
                                f"(the recipes' stage 2 writes them)")
    try:
        mats = list(kaldiio.load_ark(str(path)))
    except Exception as e:
        raise ValueError(f"{path}: not a Kaldi archive of CMVN stats ({e})") from None
    stats = {spk: cmvn_mean_std(np.asarray(m, dtype=np.float64), f"{path}: speaker {spk}") for spk, m in mats}
    out = {}
    for utt, spk in read_table(data_dir / "utt2spk").items():
        if spk not in stats:
            raise ValueError(f"{path}: no stats for speaker {spk!r} of utterance {utt} ({data_dir / 'utt2spk'}): "
                             f"rerun compute_cmvn --data {data_dir} --per-speaker")
        out[utt] = stats[spk]
    return out


@dataclass(frozen=True)
class FeatureNorm:
    """Features as the model sees them: the training set's global CMVN, ``(feats - mean) / std``
    (:func:`load_global_cmvn`), then with ``per_utterance`` each utterance's own mean over time subtracted
    (cepstral mean normalization per utterance: Kaldi's ``apply-cmvn`` with one speaker per utterance,
    ESPnet's ``utterance_mvn`` without the variance), which removes a voice's or a channel's constant
    spectral offset, also for a voice the training set never had; with ``per_utterance_var`` too each
    dimension is then divided by the utterance's own standard deviation (ESPnet's ``utterance_mvn`` with
    ``norm_vars``), floored at ``var_floor`` times the global one so that a silent band is not blown up.
    With ``per_speaker`` that mean (and variance) are the utterance's speaker's, over all its utterances
    (Kaldi's ``apply-cmvn --utt2spk``, its recipes' default): :meth:`add_speakers` reads each data dir's."""

    mean: torch.Tensor
    std: torch.Tensor
    per_utterance: bool = False
    per_utterance_var: bool = False
    var_floor: float = 0.01
    per_speaker: bool = False
    speakers: dict = field(default_factory=dict)   # utt -> its speaker's (mean, variance) after the global CMVN

    def __post_init__(self):
        if self.per_utterance_var and not self.per_utterance:
            raise ValueError("per-utterance variance normalization needs the per-utterance mean "
                             "(data.utterance_cvn=true needs data.utterance_cmn=true)")
        if self.per_speaker and not self.per_utterance:
            raise ValueError("the per-speaker statistics replace the per-utterance ones "
                             "(data.speaker_cmvn=true needs data.utterance_cmn=true)")

    def add_speakers(self, data_dir: str | Path) -> None:
        """Read the per-speaker stats of a data dir whose utterances this norm will see (nothing to do without
        ``per_speaker``); an utterance id already read from another dir with other stats is a ValueError."""
        if not self.per_speaker:
            return
        normalized = {}   # the speaker's stats in the globally normalized domain, once per speaker
        for utt, (mean, std) in load_speaker_cmvn(data_dir).items():
            key = id(mean)   # every utterance of a speaker holds the same tensors
            if key not in normalized:
                normalized[key] = ((mean - self.mean) / self.std, (std / self.std).pow(2))
            st = normalized[key]
            old = self.speakers.setdefault(utt, st)
            if old is not st and not all(bool((a == b).all()) for a, b in zip(old, st)):
                raise ValueError(f"utterance {utt} of {data_dir} has the id of another data dir's utterance by "
                                 f"another speaker: per-speaker CMVN needs utterance ids unique across sets")

    def __call__(self, feats: torch.Tensor, utt: Optional[str] = None) -> torch.Tensor:
        x = (feats - self.mean) / self.std
        if not self.per_utterance:
            return x
        if self.per_speaker:
            if utt not in self.speakers:
                raise KeyError(f"utterance {utt}: no per-speaker CMVN stats (it is in no utt2spk of the data dirs "
                               f"read; FeatureNorm.add_speakers(data dir) first)")
            centre, var = self.speakers[utt]
        else:
            centre = x.mean(dim=0, keepdim=True)
            var = (x - centre).pow(2).mean(dim=0, keepdim=True)
        x = x - centre
        if self.per_utterance_var:
            x = x / var.clamp_min(self.var_floor).sqrt()
        return x
