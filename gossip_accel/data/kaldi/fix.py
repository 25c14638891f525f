"""Fixing a Kaldi data directory, as Kaldi's ``utils/fix_data_dir.sh``: keep the utterances
every table agrees on, rebuild ``spk2utt``, sort, and report every utterance dropped and why
(:func:`fix_data_dir`)."""
from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .tables import (KNOWN_FILES, UTT_FILES, DataDirError, decode_utf8, read_entries, spk2utt_to_utt2spk,
                     utt2spk_to_spk2utt, write_spk2utt, write_table)
from .validate import audio_path_exists, positive_value, segment_fields


@dataclass
class FixReport:
    """What :func:`fix_data_dir` did: utterances before and kept, the dropped ones with the reason, notes."""
    kept: int = 0
    before: int = 0
    dropped: list[tuple[str, str]] = field(default_factory=list)   # (utterance, reason)
    notes: list[str] = field(default_factory=list)


def _first_wins(path: Path, report: FixReport, what: str) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for e in read_entries(path):
        if e.key in out:
            report.notes.append(f"{path.name}:{e.line}: duplicate {what} {e.key}: kept line {out[e.key][1]}, dropped this one")
            continue
        out[e.key] = (e.value, e.line)
    return out


def fix_data_dir(path: str | Path, check_audio: bool = True, audio_base: str | Path | None = None,
                 log="stderr") -> FixReport:
    """Make a data directory consistent, reporting every utterance it drops and why.

    Keeps the utterances present in every utterance table (``text``, ``utt2spk``,
    ``wav.scp``/``segments``, ``feats.scp``, ``utt2num_frames``, ``utt2dur``, whichever exist),
    with a non-empty transcript, and (``check_audio``) with an existing audio file; keeps the
    first of duplicate keys; rebuilds ``spk2utt`` from ``utt2spk``; keeps only the recordings,
    speakers (``spk2gender``) still used; writes every table sorted. The original files go to
    ``<dir>/.backup/`` first; the dropped utterances with their reasons to
    ``<dir>/.backup/dropped.txt`` and to ``log`` (a text stream; default sys.stderr; None: silent). Raises DataDirError when the directory has
    neither ``utt2spk`` nor ``spk2utt``, a table is not UTF-8, or no utterance would be left;
    then nothing in the directory is changed."""
    d = Path(path)
    if not d.is_dir():
        raise DataDirError(f"{d}: not a directory")
    present = [f for f in KNOWN_FILES if (d / f).is_file()]
    if "utt2spk" not in present and "spk2utt" not in present:
        raise DataDirError(f"{d}: has neither utt2spk nor spk2utt")
    for f in present:                     # every table must be readable before anything is touched
        decode_utf8(d / f)
    backup = d / ".backup"

    rep = FixReport()
    t = {f: _first_wins(d / f, rep, "key") for f in present}
    if "utt2spk" in t:
        u2s = {u: v for u, (v, _) in t["utt2spk"].items()}
    else:
        u2s = {u: s for s, (v, _) in t["spk2utt"].items() for u in v.split()}
        rep.notes.append("utt2spk was missing: made from spk2utt")
    # membership: union of all utterance tables, each utterance must be in every one
    utt_tables: dict[str, set[str]] = {"utt2spk": set(u2s)}
    for f in UTT_FILES:
        if f in t and f != "utt2spk":
            utt_tables[f] = set(t[f])
    if "segments" not in t and "wav.scp" in t:
        utt_tables["wav.scp"] = set(t["wav.scp"])
    everything = set().union(*utt_tables.values())
    rep.before = len(everything)
    reasons: dict[str, list[str]] = {}
    for u in everything:
        lacking = [f for f, s in utt_tables.items() if u not in s]
        if lacking:
            reasons.setdefault(u, []).append("not in " + ", ".join(lacking))
    for u, (v, _) in t.get("utt2spk", {}).items():
        if len(v.split()) != 1:
            reasons.setdefault(u, []).append(f"utt2spk: speaker must be one word, got {v!r}")
    for u, (v, _) in t.get("text", {}).items():
        if not v.strip():
            reasons.setdefault(u, []).append("empty transcript")
    for f in ("utt2num_frames", "utt2dur"):
        for u, (v, _) in t.get(f, {}).items():
            if not positive_value(f, v):
                reasons.setdefault(u, []).append(f"{f}: bad value {v!r}")
    base = Path(audio_base) if audio_base is not None else None
    segs: dict[str, list[str]] = {}
    if "segments" in t:
        for u, (v, _) in t["segments"].items():
            fs = segment_fields(v)
            if fs is None:
                reasons.setdefault(u, []).append(f"segments: bad value {v!r}")
            elif "wav.scp" in t and fs[0] not in t["wav.scp"]:
                reasons.setdefault(u, []).append(f"recording {fs[0]} not in wav.scp")
            else:
                segs[u] = fs
    if check_audio and "wav.scp" in t:
        for k, (v, _) in t["wav.scp"].items():
            if not v.strip():
                bad = "wav.scp: no path"
            elif not audio_path_exists(v, base):
                bad = f"audio file not found: {v}"
            else:
                continue
            if "segments" in t:
                for u, fs in segs.items():
                    if fs[0] == k:
                        reasons.setdefault(u, []).append(f"{bad} (recording {k})")
            else:
                reasons.setdefault(k, []).append(bad)
    if check_audio and "feats.scp" in t:
        for u, (v, _) in t["feats.scp"].items():
            if not audio_path_exists(v, base):
                reasons.setdefault(u, []).append(f"feats.scp: file not found: {v}")
    keep = sorted(everything - set(reasons))
    rep.kept = len(keep)
    rep.dropped = sorted((u, "; ".join(r)) for u, r in reasons.items())
    if not keep:                          # nothing would be left: change nothing, say why
        first = f" (first: {rep.dropped[0][0]}: {rep.dropped[0][1]})" if rep.dropped else ""
        raise DataDirError(f"{d}: every utterance would be dropped ({rep.before} of {rep.before}){first}; "
                           f"nothing was changed: fix the data preparation")
    backup.mkdir(exist_ok=True)
    for f in present:
        shutil.copy2(d / f, backup / f)

    # write back
    u2s_kept = {u: u2s[u] for u in keep}
    if "spk2utt" in t:
        old = {s: v.split() for s, (v, _) in t["spk2utt"].items()}
        if spk2utt_to_utt2spk(old) != u2s:
            rep.notes.append("spk2utt disagreed with utt2spk: rebuilt from utt2spk")
    for f in UTT_FILES:
        if f in t:
            write_table(d / f, {u: t[f][u][0] for u in keep})
    if "utt2spk" not in t:
        write_table(d / "utt2spk", u2s_kept)
    spk2utt = utt2spk_to_spk2utt(u2s_kept)
    write_spk2utt(d / "spk2utt", spk2utt)
    if "wav.scp" in t:
        if "segments" in t:
            recos = {segs[u][0] for u in keep}
            gone = sorted(set(t["wav.scp"]) - recos)
            if gone:
                rep.notes.append(f"wav.scp: dropped {len(gone)} recording(s) without kept segments: {' '.join(gone[:10])}"
                                 + (" ..." if len(gone) > 10 else ""))
            write_table(d / "wav.scp", {r: t["wav.scp"][r][0] for r in recos})
            if "reco2file_and_channel" in t:
                write_table(d / "reco2file_and_channel",
                            {r: v for r, (v, _) in t["reco2file_and_channel"].items() if r in recos})
        else:
            write_table(d / "wav.scp", {u: t["wav.scp"][u][0] for u in keep})
    if "spk2gender" in t:
        write_table(d / "spk2gender", {s: v for s, (v, _) in t["spk2gender"].items() if s in spk2utt})

    lines = [f"{u} {r}" for u, r in rep.dropped]
    (backup / "dropped.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    if log == "stderr":
        log = sys.stderr
    if log is not None:
        for n in rep.notes:
            print(f"fix_data_dir: {d}: {n}", file=log)
        for u, r in rep.dropped:
            print(f"fix_data_dir: {d}: dropped {u}: {r}", file=log)
        print(f"fix_data_dir: {d}: kept {rep.kept} of {rep.before} utterances ({len(rep.dropped)} dropped, "
              f"listed in {backup / 'dropped.txt'}; originals in {backup}/)", file=log)
    return rep
