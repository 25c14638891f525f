"""Kaldi data directories: read and write their files, validate them, fix them.

A data directory holds one table per file, one ``<key> <value>`` line per entry, sorted by
key in C-locale byte order (= code-point order for UTF-8), keys unique and without
whitespace. The value is **the rest of the line** after the first run of whitespace
(trailing whitespace removed), so a ``wav.scp`` path may contain spaces; a ``wav.scp`` value
ending in ``|`` is a shell command whose stdout is the audio (Kaldi's pipes); validation
accepts it without running it, and ``compute_fbank`` runs it only with ``--allow-pipes``
(:func:`refuse_commands`: nothing runs text from a data file unless the user opts in).

| file | key | value |
|---|---|---|
| ``wav.scp`` | utterance (recording if ``segments`` exists) | path or ``command |`` |
| ``text`` | utterance | transcript (may not be empty) |
| ``utt2spk`` | utterance | speaker |
| ``spk2utt`` | speaker | its utterances, sorted |
| ``spk2gender`` | speaker | ``m`` / ``f`` |
| ``segments`` | utterance | ``<recording> <start-s> <end-s>`` |
| ``reco2file_and_channel`` | recording | ``<file> <channel>`` |
| ``feats.scp`` | utterance | ``file.ark:offset`` (or a path) |
| ``utt2num_frames`` | utterance | integer |
| ``utt2dur`` | utterance | seconds |

``validate_data_dir(path)`` returns the problems (each naming file and line), like Kaldi's
``utils/validate_data_dir.sh``; ``fix_data_dir(path)`` keeps the utterances present in every
utterance table (and with a transcript and audio), rebuilds ``spk2utt``, sorts, and reports
every utterance it drops and why (stderr and ``<dir>/.backup/dropped.txt``; the original files
are copied to ``<dir>/.backup/`` first), like Kaldi's ``utils/fix_data_dir.sh``.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# utterance-level tables (key = utterance id); wav.scp is one unless segments exists
UTT_FILES = ("text", "utt2spk", "feats.scp", "utt2num_frames", "utt2dur", "segments")
KNOWN_FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "spk2gender", "segments", "reco2file_and_channel",
               "feats.scp", "utt2num_frames", "utt2dur")
DEFAULT_NEED = ("wav.scp", "text", "utt2spk", "spk2utt")
MAX_REPORT = 20          # per kind of problem; the rest are counted
_OFFSET = re.compile(r"^(.*):(\d+)(\[[^\]]*\])?$")


class DataDirError(ValueError):
    """A file that cannot be read as a table (not UTF-8, a line without a key)."""


@dataclass
class Entry:
    key: str
    value: str
    line: int


# --------------------------------------------------------------------------------------
# Reading and writing tables
# --------------------------------------------------------------------------------------

def _decode(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataDirError(f"{path}:{line}: not UTF-8 (byte 0x{data[e.start]:02x})") from None


def read_entries(path: str | Path) -> list[Entry]:
    """Every line of a table as (key, value = rest of the line, line number), in file order,
    duplicates kept. Blank lines are skipped. Raises DataDirError on non-UTF-8 input."""
    path = Path(path)
    out = []
    for n, line in enumerate(_decode(path).split("\n"), 1):
        line = line.rstrip()
        if not line.strip():
            continue
        parts = line.split(None, 1)
        out.append(Entry(parts[0], parts[1] if len(parts) > 1 else "", n))
    return out


def read_table(path: str | Path) -> dict[str, str]:
    """key -> value (the rest of the line). A duplicate key is an error naming both lines."""
    out: dict[str, str] = {}
    first: dict[str, int] = {}
    for e in read_entries(path):
        if e.key in out:
            raise DataDirError(f"{path}:{e.line}: duplicate key {e.key} (first on line {first[e.key]})")
        out[e.key] = e.value
        first[e.key] = e.line
    return out


def write_table(path: str | Path, table: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
    """Write ``key value`` lines sorted by key (C order), atomically (temporary file + rename)."""
    path = Path(path)
    items = list(table.items()) if isinstance(table, Mapping) else list(table)
    items.sort(key=lambda kv: kv[0])
    seen = set()
    for k, v in items:
        if not k or any(c.isspace() for c in k):
            raise ValueError(f"{path}: invalid key {k!r} (must be non-empty, without whitespace)")
        if k in seen:
            raise ValueError(f"{path}: duplicate key {k}")
        seen.add(k)
        if "\n" in v or "\r" in v:
            raise ValueError(f"{path}: value of {k} contains a line break")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for k, v in items:
            f.write(f"{k} {v}\n" if v != "" else f"{k}\n")
    os.replace(tmp, path)


def is_command(value: str) -> bool:
    """A table value that Kaldi (and kaldiio) would run as a shell command: ``cmd |`` (read
    from a pipe) or ``| cmd`` (write to one)."""
    v = value.strip()
    return v.endswith("|") or v.startswith("|")


def refuse_commands(path: str | Path, fix: str) -> None:
    """Raise :class:`DataDirError` naming the first line of ``path`` whose value is a shell
    command (``... |``). Nothing in gossip_accel runs text from a data file unless the user
    opts in (``fix`` tells how, or what to write instead)."""
    for e in read_entries(path):
        if is_command(e.value):
            raise DataDirError(f"{path}:{e.line}: {e.key}: the value {e.value!r} is a shell command (a Kaldi pipe); "
                               f"commands in data files are not run: {fix}")


def read_wav_scp(path) -> dict[str, str]:
    return read_table(path)


def read_text(path) -> dict[str, str]:
    return read_table(path)


def read_utt2spk(path) -> dict[str, str]:
    return read_table(path)


def read_spk2gender(path) -> dict[str, str]:
    return read_table(path)


def read_spk2utt(path) -> dict[str, list[str]]:
    return {k: v.split() for k, v in read_table(path).items()}


def read_feats_scp(path) -> dict[str, str]:
    return read_table(path)


def read_segments(path) -> dict[str, tuple[str, float, float]]:
    out = {}
    for k, v in read_table(path).items():
        f = v.split()
        if len(f) != 3:
            raise DataDirError(f"{path}: {k}: expected '<utt> <recording> <start> <end>', got {v!r}")
        out[k] = (f[0], float(f[1]), float(f[2]))
    return out


def read_reco2file_and_channel(path) -> dict[str, tuple[str, str]]:
    out = {}
    for k, v in read_table(path).items():
        f = v.split()
        if len(f) != 2:
            raise DataDirError(f"{path}: {k}: expected '<recording> <file> <channel>', got {v!r}")
        out[k] = (f[0], f[1])
    return out


def read_utt2num_frames(path) -> dict[str, int]:
    return {k: int(v) for k, v in read_table(path).items()}


def read_utt2dur(path) -> dict[str, float]:
    return {k: float(v) for k, v in read_table(path).items()}


def write_wav_scp(path, table: Mapping[str, str]) -> None:
    write_table(path, table)


def write_text(path, table: Mapping[str, str]) -> None:
    write_table(path, table)


def write_utt2spk(path, table: Mapping[str, str]) -> None:
    write_table(path, table)


def write_spk2gender(path, table: Mapping[str, str]) -> None:
    write_table(path, table)


def write_feats_scp(path, table: Mapping[str, str]) -> None:
    write_table(path, table)


def write_spk2utt(path, table: Mapping[str, Sequence[str]]) -> None:
    write_table(path, {k: " ".join(sorted(v)) for k, v in table.items()})


def write_segments(path, table: Mapping[str, tuple[str, float, float]]) -> None:
    write_table(path, {k: f"{r} {_num(s)} {_num(e)}" for k, (r, s, e) in table.items()})


def write_reco2file_and_channel(path, table: Mapping[str, tuple[str, str]]) -> None:
    write_table(path, {k: f"{f} {c}" for k, (f, c) in table.items()})


def write_utt2num_frames(path, table: Mapping[str, int]) -> None:
    write_table(path, {k: str(int(v)) for k, v in table.items()})


def write_utt2dur(path, table: Mapping[str, float]) -> None:
    write_table(path, {k: _num(v) for k, v in table.items()})


def _num(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def utt2spk_to_spk2utt(utt2spk: Mapping[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for u in sorted(utt2spk):
        out.setdefault(utt2spk[u], []).append(u)
    return out


def spk2utt_to_utt2spk(spk2utt: Mapping[str, Sequence[str]]) -> dict[str, str]:
    return {u: s for s, us in spk2utt.items() for u in us}


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------

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


def _positive(f: str, value: str) -> bool:
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
            if not _positive(f, v):
                p.add(f"{f}: value", f"{d / f}:{ln}: {k}: expected a positive {'integer' if f == 'utt2num_frames' else 'number'}, got {v!r}")
    recos = set(tables.get("wav.scp", {}))
    for k, (v, ln) in tables.get("segments", {}).items():
        fs = v.split()
        try:
            ok = len(fs) == 3 and 0 <= float(fs[1]) < float(fs[2])
        except ValueError:
            ok = False
        if not ok:
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


# --------------------------------------------------------------------------------------
# Fixing
# --------------------------------------------------------------------------------------

@dataclass
class FixReport:
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
        _decode(d / f)
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
            if not _positive(f, v):
                reasons.setdefault(u, []).append(f"{f}: bad value {v!r}")
    base = Path(audio_base) if audio_base is not None else None
    segs: dict[str, list[str]] = {}
    if "segments" in t:
        for u, (v, _) in t["segments"].items():
            fs = v.split()
            try:
                ok = len(fs) == 3 and 0 <= float(fs[1]) < float(fs[2])
            except ValueError:
                ok = False
            if not ok:
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
