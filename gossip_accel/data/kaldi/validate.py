"""Validation of a Kaldi data directory, as Kaldi's ``utils/validate_data_dir.sh``: every
problem named with its file and line (:func:`validate_data_dir`), and the value rules that
:mod:`gossip_accel.data.kaldi.fix` applies too."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from .tables import DEFAULT_NEED, KNOWN_FILES, UTT_FILES, DataDirError, Entry, read_entries

MAX_REPORT = 20          # per kind of problem; the rest are counted
_OFFSET = re.compile(r"^(.*):(\d+)(\[[^\]]*\])?$")


def audio_path_exists(value: str, base: Path | None = None) -> bool:
    """A wav.scp / feats.scp value names an existing file (pipes count as existing; so does
    ``file.ark:offset`` whose file exists). Relative paths are relative to base (default: cwd)."""
    v = value.strip()
    if v.endswith("|"):
        return True

    def exists(p: str) -> bool:
        q = Path(p)
        if not q.is_absolute() and base is not None:
            q = base / q
        return q.is_file()

    if exists(v):
        return True
    m = _OFFSET.match(v)
    return bool(m) and exists(m.group(1))


class _Problems:
    def __init__(self):
        self.items: list[str] = []
        self.counts: dict[str, int] = {}

    def add(self, kind: str, msg: str) -> None:
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        if n <= MAX_REPORT:
            self.items.append(msg)

    def finish(self) -> list[str]:
        for kind, n in self.counts.items():
            if n > MAX_REPORT:
                self.items.append(f"... and {n - MAX_REPORT} more problems of this kind: {kind}")
        return self.items


def segment_fields(value: str) -> list[str] | None:
    """``[recording, start, end]`` of a ``segments`` value with 0 <= start < end, else None."""
    fields = value.split()
    try:
        return fields if len(fields) == 3 and 0 <= float(fields[1]) < float(fields[2]) else None
    except ValueError:
        return None


def positive_value(f: str, value: str) -> bool:
    """A valid ``utt2num_frames`` (positive integer) or ``utt2dur`` (positive number) value."""
    try:
        return (int(value) > 0) if f == "utt2num_frames" else (float(value) > 0)
    except ValueError:
        return False


def validate_data_dir(path: str | Path, need: Sequence[str] = DEFAULT_NEED, check_audio: bool = True,
                      audio_base: str | Path | None = None) -> list[str]:
    """The problems of a data directory, each naming its file and line ([] = valid).

    Checks: the files in ``need`` exist (``wav.scp``, ``text``, ``utt2spk``, ``spk2utt`` by
    default); every table is UTF-8 with sorted, unique keys and a value on each line;
    transcripts are not empty; all utterance tables hold the same utterances (``utt2spk`` is
    the reference); ``spk2utt`` is exactly ``utt2spk`` inverted; utterance ids sort the same
    way by utterance and by (speaker, utterance) (Kaldi's rule: speaker ids prefix utterance
    ids); ``segments`` refer to recordings of ``wav.scp`` and have 0 <= start < end;
    numbers are numbers; with ``check_audio``, ``wav.scp`` / ``feats.scp`` paths exist (pipes
    ``... |`` are not run), relative to ``audio_base`` (default: the current directory, as
    in Kaldi)."""
    d = Path(path)
    p = _Problems()
    if not d.is_dir():
        return [f"{d}: not a directory"]
    for f in need:
        if not (d / f).is_file():
            p.add("missing file", f"{d / f}: missing (required)")
    entries: dict[str, list[Entry]] = {}
    for f in KNOWN_FILES:
        fp = d / f
        if not fp.is_file():
            continue
        try:
            es = read_entries(fp)
        except DataDirError as e:
            p.add(f"{f}: encoding", str(e))
            continue
        entries[f] = es
        if not es:
            p.add(f"{f}: empty", f"{fp}: empty file")
        prev: Entry | None = None
        first: dict[str, int] = {}
        for e in es:
            if e.key in first:
                p.add(f"{f}: duplicate", f"{fp}:{e.line}: duplicate key {e.key} (first on line {first[e.key]})")
            else:
                first[e.key] = e.line
            if prev is not None and e.key < prev.key:
                p.add(f"{f}: unsorted", f"{fp}:{e.line}: not sorted: {e.key} after {prev.key} "
                                        f"(sort with LC_ALL=C sort -k1,1 or fix_data_dir)")
            prev = e
            if e.value == "":
                what = "empty transcript" if f == "text" else "no value"
                p.add(f"{f}: {what}", f"{fp}:{e.line}: {what} for {e.key}")
    tables = {f: {e.key: (e.value, e.line) for e in reversed(es)} for f, es in entries.items()}  # first wins

    # formats of the value
    for f in ("utt2num_frames", "utt2dur"):
        for k, (v, ln) in tables.get(f, {}).items():
            if not positive_value(f, v):
                p.add(f"{f}: value", f"{d / f}:{ln}: {k}: expected a positive {'integer' if f == 'utt2num_frames' else 'number'}, got {v!r}")
    recos = set(tables.get("wav.scp", {}))
    for k, (v, ln) in tables.get("segments", {}).items():
        fs = segment_fields(v)
        if fs is None:
            p.add("segments: value", f"{d / 'segments'}:{ln}: {k}: expected '<recording> <start> <end>' with 0 <= start < end, got {v!r}")
        elif "wav.scp" in tables and fs[0] not in recos:
            p.add("segments: recording", f"{d / 'segments'}:{ln}: {k}: recording {fs[0]} not in wav.scp")
    for k, (v, ln) in tables.get("reco2file_and_channel", {}).items():
        if len(v.split()) != 2:
            p.add("reco2file_and_channel: value", f"{d / 'reco2file_and_channel'}:{ln}: {k}: expected '<file> <channel>', got {v!r}")
        elif "wav.scp" in tables and k not in recos:
            p.add("reco2file_and_channel: recording", f"{d / 'reco2file_and_channel'}:{ln}: recording {k} not in wav.scp")
    if check_audio:
        base = Path(audio_base) if audio_base is not None else None
        for f in ("wav.scp", "feats.scp"):
            for k, (v, ln) in tables.get(f, {}).items():
                if v and not audio_path_exists(v, base):
                    p.add(f"{f}: missing audio", f"{d / f}:{ln}: {k}: file not found: {v}")

    # the same utterances everywhere (utt2spk is the reference)
    utt_files = [f for f in UTT_FILES if f in tables]
    if "segments" not in tables and "wav.scp" in tables:
        utt_files.insert(0, "wav.scp")
    ref_name = "utt2spk" if "utt2spk" in tables else (utt_files[0] if utt_files else None)
    if ref_name is not None:
        ref = tables[ref_name]
        for f in utt_files:
            if f == ref_name:
                continue
            t = tables[f]
            for k, (_, ln) in sorted(t.items(), key=lambda kv: kv[1][1]):
                if k not in ref:
                    p.add(f"{f}: extra", f"{d / f}:{ln}: utterance {k} is not in {ref_name}")
            for k, (_, ln) in sorted(ref.items(), key=lambda kv: kv[1][1]):
                if k not in t:
                    p.add(f"{f}: lacking", f"{d / ref_name}:{ln}: utterance {k} has no entry in {f}")

    # utt2spk <-> spk2utt
    u2s = {k: v for k, (v, _) in tables.get("utt2spk", {}).items()}
    for k, (v, ln) in tables.get("utt2spk", {}).items():
        if v and len(v.split()) != 1:
            p.add("utt2spk: value", f"{d / 'utt2spk'}:{ln}: {k}: speaker id must be one word, got {v!r}")
    if "spk2utt" in tables and "utt2spk" in tables:
        seen: dict[str, str] = {}
        for s, (v, ln) in sorted(tables["spk2utt"].items(), key=lambda kv: kv[1][1]):
            us = v.split()
            if us != sorted(us):
                p.add("spk2utt: unsorted", f"{d / 'spk2utt'}:{ln}: utterances of {s} are not sorted")
            for u in us:
                if u in seen:
                    p.add("spk2utt: twice", f"{d / 'spk2utt'}:{ln}: utterance {u} also listed under speaker {seen[u]}")
                seen[u] = s
                if u not in u2s:
                    p.add("spk2utt: extra", f"{d / 'spk2utt'}:{ln}: utterance {u} of {s} is not in utt2spk")
                elif u2s[u] != s:
                    p.add("spk2utt: disagree", f"{d / 'spk2utt'}:{ln}: utterance {u} is under {s}, but utt2spk says {u2s[u]}")
        for u, (s, ln) in sorted(tables["utt2spk"].items(), key=lambda kv: kv[1][1]):
            if u not in seen:
                p.add("spk2utt: lacking", f"{d / 'utt2spk'}:{ln}: utterance {u} (speaker {s}) is not in spk2utt")
    if "spk2gender" in tables and u2s:
        spks = set(u2s.values())
        for s, (v, ln) in tables["spk2gender"].items():
            if s not in spks:
                p.add("spk2gender: extra", f"{d / 'spk2gender'}:{ln}: speaker {s} has no utterances in utt2spk")
            if v not in ("m", "f"):
                p.add("spk2gender: value", f"{d / 'spk2gender'}:{ln}: {s}: gender must be m or f, got {v!r}")
        for s in sorted(spks - set(tables["spk2gender"])):
            p.add("spk2gender: lacking", f"{d / 'spk2gender'}: speaker {s} has no gender")
    if u2s:
        by_utt = sorted(u2s)
        by_spk = sorted(u2s, key=lambda u: (u2s[u], u))
        if by_utt != by_spk:
            i = next(i for i, (a, b) in enumerate(zip(by_utt, by_spk)) if a != b)
            p.add("utt2spk: order", f"{d / 'utt2spk'}: sorting by utterance and by (speaker, utterance) disagree "
                                    f"({by_utt[i]} vs {by_spk[i]}): make each speaker id a prefix of its utterance ids")
    return p.finish()
