"""Kaldi data-directory tables: one ``<key> <value>`` line per entry, read and written.

The format, and what each file holds, is in the package docstring (:mod:`gossip_accel.data.kaldi`).
Writing sorts by key (C order) and replaces the file atomically; reading reports a non-UTF-8
byte or a duplicate key with the file and line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# utterance-level tables (key = utterance id); wav.scp is one unless segments exists
UTT_FILES = ("text", "utt2spk", "feats.scp", "utt2num_frames", "utt2dur", "segments")
KNOWN_FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "spk2gender", "segments", "reco2file_and_channel",
               "feats.scp", "utt2num_frames", "utt2dur")
DEFAULT_NEED = ("wav.scp", "text", "utt2spk", "spk2utt")


class DataDirError(ValueError):
    """A file that cannot be read as a table (not UTF-8, a line without a key)."""


@dataclass
class Entry:
    key: str
    value: str
    line: int


def decode_utf8(path: Path) -> str:
    """The text of ``path``; :class:`DataDirError` naming the line of the first non-UTF-8 byte."""
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
    for n, line in enumerate(decode_utf8(path).split("\n"), 1):
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
