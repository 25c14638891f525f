"""Prefixed copies of a Kaldi data dir, as Kaldi's ``utils/copy_data_dir.sh --utt-prefix --spk-prefix``.

A perturbed copy of a training set (speed, :mod:`gossip_accel.data.speed_perturb`; noise and
reverberation, :mod:`gossip_accel.data.augment`) is the original's tables once per prefix: every
utterance, speaker and recording id gets the prefix, so a copy is a new speaker to CMVN and to
the speaker-keyed tables and the tables stay sorted by speaker. ``wav.scp`` keeps the original
audio; what changes the audio is a per-utterance table of the copy (``utt2speed``,
``utt2augment``) that the feature extraction reads. Features are recomputed, so ``feats.scp``,
``utt2num_frames`` and ``cmvn.ark`` are never copied (and are removed from the output).
"""
from __future__ import annotations

from pathlib import Path

from .tables import read_table, utt2spk_to_spk2utt, write_spk2utt, write_table

REQUIRED = ("wav.scp", "text", "utt2spk")
CARRIED = (*REQUIRED, "segments", "reco2file_and_channel", "spk2gender", "utt2dur")
STALE = ("feats.scp", "utt2num_frames", "cmvn.ark")
#: per-utterance tables that change a copy's audio at feature extraction: the speed (applied
#: first, :mod:`gossip_accel.data.speed_perturb`), then noise and reverberation (:mod:`gossip_accel.data.augment`)
PERTURBATIONS = ("utt2speed", "utt2augment")

Tables = dict[str, dict[str, str]]


def read_data_dir_tables(src: str | Path) -> Tables:
    """The tables of ``src`` a copy carries (:data:`CARRIED` and :data:`PERTURBATIONS` that exist);
    FileNotFoundError naming the first missing required file."""
    src = Path(src)
    for f in REQUIRED:
        if not (src / f).is_file():
            raise FileNotFoundError(f"{src / f} not found: {src} is not a Kaldi data dir (stage 0/1 first)")
    return {f: read_table(src / f) for f in (*CARRIED, *PERTURBATIONS) if (src / f).is_file()}


def add_prefixed_copy(out: Tables, tables: Tables, prefix: str, speed: float = 1.0) -> list[str]:
    """Add to ``out`` one copy of every utterance of ``tables`` with ``prefix`` on its utterance,
    speaker and recording ids; ``utt2dur`` is divided by ``speed``. Tables other than
    :data:`CARRIED` are per-utterance and copied by key (``wav.scp``'s keys are recordings when
    ``segments`` exists: they get the prefix as well). Returns the new utterance ids."""
    for name, table in tables.items():
        dst = out.setdefault(name, {})
        for key, value in table.items():
            if name == "utt2spk":
                value = prefix + value
            elif name == "segments":
                reco, rest = value.split(maxsplit=1)
                value = f"{prefix}{reco} {rest}"
            elif name == "utt2dur":
                value = f"{float(value) / speed:.3f}" if speed != 1.0 else value
            dst[prefix + key] = value
    return [prefix + utt for utt in tables["text"]]


def write_data_dir(dst: str | Path, out: Tables, src: str | Path) -> dict:
    """Write ``out``'s tables and ``spk2utt`` into ``dst`` (not ``src``), removing features of an
    earlier run; returns {"utterances": n, "speakers": n}."""
    dst = Path(dst)
    if Path(src).resolve() == dst.resolve():
        raise ValueError(f"{dst}: the output must be another dir than {src}")
    dst.mkdir(parents=True, exist_ok=True)
    for name in STALE:
        (dst / name).unlink(missing_ok=True)
    for name, table in out.items():
        write_table(dst / name, table)
    write_spk2utt(dst / "spk2utt", utt2spk_to_spk2utt(out["utt2spk"]))
    return {"utterances": len(out["text"]), "speakers": len(set(out["utt2spk"].values()))}

