"""Speed perturbation of a Kaldi data dir (Ko et al. 2015), without sox.

:func:`perturb_data_dir_speed` has the semantics of Kaldi's
``utils/data/perturb_data_dir_speed_3way.sh``: the output holds the original utterances and,
for every other factor f (0.9 and 1.1 by default), a copy of each whose utterance, speaker and
recording ids carry the prefix ``sp<f>-`` (``sp0.9-1034-121119-0001``), so that a perturbed
copy is a new speaker to CMVN and to the speaker-keyed tables. Kaldi writes ``sox ... speed f |``
into ``wav.scp``; here ``wav.scp`` keeps the original audio and ``utt2speed`` (``<utt> <f>``)
tells the feature extraction (:func:`gossip_accel.data.features.load_utterance`) to change the
speed on the fly, as sox's ``speed`` does: the signal is read as if sampled at ``f * rate`` and
resampled to ``rate`` (tempo and pitch both x f, duration / f). Segment times stay those of the
original recording (the segment is cut, then its speed changed); ``utt2dur`` is divided by f;
features are recomputed, so ``feats.scp`` and ``utt2num_frames`` are not copied.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .kaldi.copy import PERTURBATIONS, Tables, add_prefixed_copy, read_data_dir_tables, write_data_dir
from .kaldi.tables import read_table

SPEED_FILE = PERTURBATIONS[0]   # utt2speed
DEFAULT_FACTORS = (0.9, 1.0, 1.1)


def speed_prefix(factor: float) -> str:
    """``sp0.9-`` for 0.9; nothing for 1 (the original utterances keep their ids)."""
    return "" if factor == 1.0 else f"sp{factor:g}-"


def parse_factors(text: str) -> tuple[float, ...]:
    """``"0.9 1.0 1.1"`` or ``"0.9,1.0,1.1"`` -> (0.9, 1.0, 1.1); each in (0.5, 2), no repeats."""
    try:
        factors = tuple(float(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"speed factors {text!r}: give numbers, e.g. '0.9 1.0 1.1'") from None
    if not factors or any(not 0.5 < f < 2.0 for f in factors) or len(set(factors)) != len(factors):
        raise ValueError(f"speed factors {text!r}: give distinct numbers between 0.5 and 2, e.g. '0.9 1.0 1.1'")
    return factors


def read_speeds(data_dir: str | Path) -> dict[str, float]:
    """``<data>/utt2speed`` as {utt: factor}; empty when the data dir has none (every factor 1)."""
    path = Path(data_dir) / SPEED_FILE
    if not path.is_file():
        return {}
    out = {}
    for utt, v in read_table(path).items():
        try:
            out[utt] = float(v)
        except ValueError:
            raise ValueError(f"{path}: {utt}: the speed factor {v!r} is not a number") from None
        if not 0.5 < out[utt] < 2.0:
            raise ValueError(f"{path}: {utt}: speed factor {v} outside (0.5, 2)")
    return out


def perturb_data_dir_speed(src: str | Path, dst: str | Path, factors: Sequence[float] = DEFAULT_FACTORS) -> dict:
    """Write ``dst``: every utterance of ``src`` once per factor (see the module docstring).

    Returns {"utterances": n, "speakers": n} of ``dst``. ``src`` needs ``wav.scp``, ``text``
    and ``utt2spk``; ``segments``, ``reco2file_and_channel``, ``spk2gender``, ``utt2dur`` and
    ``utt2augment`` (:mod:`.augment`, applied after the speed change) are carried over when
    present. A ``src`` that is itself perturbed (has ``utt2speed``) is refused."""
    src, dst = Path(src), Path(dst)
    factors = parse_factors(" ".join(str(f) for f in factors))
    tables = read_data_dir_tables(src)
    if (src / SPEED_FILE).is_file():
        raise ValueError(f"{src / SPEED_FILE} exists: {src} is already speed-perturbed")
    out: Tables = {}
    speeds: dict[str, str] = {}
    for factor in factors:
        for utt in add_prefixed_copy(out, tables, speed_prefix(factor), speed=factor):
            speeds[utt] = f"{factor:g}"
    out[SPEED_FILE] = speeds
    return write_data_dir(dst, out, src)
