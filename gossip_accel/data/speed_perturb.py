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

from .kaldi.tables import read_table, utt2spk_to_spk2utt, write_spk2utt, write_table

SPEED_FILE = "utt2speed"
COPIED_BY_UTT = ("text", "utt2spk")            # value kept (utt2spk's speaker is prefixed)
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
    and ``utt2spk``; ``segments``, ``reco2file_and_channel``, ``spk2gender`` and ``utt2dur`` are
    carried over when present. A ``src`` that is itself perturbed (has ``utt2speed``) is refused."""
    src, dst = Path(src), Path(dst)
    factors = parse_factors(" ".join(str(f) for f in factors))
    for f in ("wav.scp", "text", "utt2spk"):
        if not (src / f).is_file():
            raise FileNotFoundError(f"{src / f} not found: {src} is not a Kaldi data dir (stage 0/1 first)")
    if (src / SPEED_FILE).is_file():
        raise ValueError(f"{src / SPEED_FILE} exists: {src} is already speed-perturbed")
    if src.resolve() == dst.resolve():
        raise ValueError(f"{dst}: the output must be another dir than {src}")
    tables = {f: read_table(src / f) for f in ("wav.scp", *COPIED_BY_UTT, "segments", "reco2file_and_channel",
                                               "spk2gender", "utt2dur") if (src / f).is_file()}
    has_segments = "segments" in tables
    out: dict[str, dict[str, str]] = {f: {} for f in tables}
    speeds: dict[str, str] = {}
    for factor in factors:
        p = speed_prefix(factor)
        for utt, text in tables["text"].items():
            out["text"][p + utt] = text
            speeds[p + utt] = f"{factor:g}"
        for utt, spk in tables["utt2spk"].items():
            out["utt2spk"][p + utt] = p + spk
        for key, value in tables["wav.scp"].items():   # recordings (utterances without segments)
            out["wav.scp"][p + key] = value
        if has_segments:
            for utt, value in tables["segments"].items():
                reco, rest = value.split(maxsplit=1)
                out["segments"][p + utt] = f"{p}{reco} {rest}"
        for reco, value in tables.get("reco2file_and_channel", {}).items():
            out["reco2file_and_channel"][p + reco] = value
        for spk, value in tables.get("spk2gender", {}).items():
            out["spk2gender"][p + spk] = value
        for utt, value in tables.get("utt2dur", {}).items():
            out["utt2dur"][p + utt] = f"{float(value) / factor:.3f}"
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("feats.scp", "utt2num_frames", "cmvn.ark"):   # stale features of an earlier run
        (dst / name).unlink(missing_ok=True)
    for name, table in out.items():
        write_table(dst / name, table)
    write_spk2utt(dst / "spk2utt", utt2spk_to_spk2utt(out["utt2spk"]))
    write_table(dst / SPEED_FILE, speeds)
    return {"utterances": len(out["text"]), "speakers": len(set(out["utt2spk"].values()))}
