#!/usr/bin/env python3
"""One LibriSpeech subset (the real openslr layout) -> a Kaldi data directory.

    python local/data_prep.py --src /data/LibriSpeech/train-clean-100 --out data/train_clean_100
    python local/data_prep.py --src data/mini_librispeech/dev-clean --out data/dev_clean --speaker chapter

``--src`` is one subset folder: ``<spk>/<chapter>/<spk>-<chapter>-<utt>.flac`` plus
``<spk>/<chapter>/<spk>-<chapter>.trans.txt`` (lines ``<utt-id> UPPER CASE WORDS``). Writes into
``--out``, every file sorted by key in C-locale byte order:

* ``wav.scp``  ``<utt> <absolute path of the .flac>``. The value is the REST OF THE LINE: a
  path may contain spaces (Kaldi's convention; soundfile reads FLAC, no ``flac -d |`` pipe).
* ``text``     ``<utt> <transcript>`` as in trans.txt.
* ``utt2spk`` / ``spk2utt``: the speaker is the reader ``<spk>`` (``--speaker reader``, default;
  LibriSpeech's speaker ids), or ``<spk>-<chapter>`` (``--speaker chapter``: Kaldi's own
  librispeech recipe, one "speaker" per chapter for CMVN). Utterance ids start with the
  speaker id either way, so sorting by utterance and by speaker agree.
* ``utt2dur``  seconds, from the FLAC header.
* ``spk2gender`` when ``SPEAKERS.TXT`` is found next to (or one above) the subset folder.

Never silent: an utterance whose ``.flac`` is missing or unreadable, whose transcript is
empty, whose id does not match its folders, or that is listed twice, is reported on stderr and
left out; a ``.flac`` without a transcript line is reported (and left out). A trans.txt that
is not UTF-8 stops the script with its file and line. Exit 1 when nothing is left.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gossip_accel.data.kaldi.tables import (utt2spk_to_spk2utt, write_spk2gender, write_spk2utt,  # noqa: E402
                                                  write_table)

PROG = "data_prep.py"
_UTT = re.compile(r"^(\d+)-(\d+)-(\d+)$")


class PrepError(Exception):
    pass


def read_trans(path: Path) -> list[tuple[int, str, str]]:
    """(line number, utterance id, transcript) of a .trans.txt; PrepError on non-UTF-8."""
    data = path.read_bytes()
    out = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PrepError(f"{path}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
        line = line.strip()
        if not line:
            continue
        parts = line.split(None, 1)
        out.append((n, parts[0], parts[1].strip() if len(parts) > 1 else ""))
    return out


def read_speakers_txt(src: Path) -> dict[str, str]:
    """reader id -> 'm'/'f' from LibriSpeech's SPEAKERS.TXT (beside or above the subset)."""
    for cand in (src.parent / "SPEAKERS.TXT", src.parent.parent / "SPEAKERS.TXT"):
        if cand.is_file():
            out = {}
            for line in cand.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith(";") or "|" not in line:
                    continue
                f = [x.strip() for x in line.split("|")]
                if len(f) >= 2 and f[0].isdigit() and f[1] in ("M", "F"):
                    out[f[0]] = f[1].lower()
            return out
    return {}


def prepare(src: Path, out: Path, speaker: str = "reader", log=None) -> dict:
    """Write the data directory; returns counts. Problems go to log (default stderr) as 'data_prep.py: WHERE: WHAT'."""
    import soundfile as sf

    if not src.is_dir():
        raise PrepError(f"{src}: no such directory (expected a LibriSpeech subset, e.g. .../LibriSpeech/train-clean-100)")
    problems: list[str] = []

    def report(msg: str) -> None:
        problems.append(msg)
        print(f"{PROG}: {msg}", file=log or sys.stderr)

    wav, text, utt2spk, utt2dur = {}, {}, {}, {}
    trans_files = sorted(src.glob("*/*/*.trans.txt"))
    if not trans_files:
        raise PrepError(f"{src}: no <spk>/<chapter>/<spk>-<chapter>.trans.txt files: not a LibriSpeech subset folder")
    seen_flac: set[Path] = set()
    listed: dict[str, str] = {}
    for tf in trans_files:
        reader, chapter = tf.parent.parent.name, tf.parent.name
        if tf.name != f"{reader}-{chapter}.trans.txt":
            report(f"{tf}: unexpected name (expected {reader}-{chapter}.trans.txt); read anyway")
        for n, utt, words in read_trans(tf):
            where = f"{tf}:{n}"
            m = _UTT.match(utt)
            if not m or (m.group(1), m.group(2)) != (reader, chapter):
                report(f"{where}: utterance id {utt} does not match its folder {reader}/{chapter} "
                       f"(expected {reader}-{chapter}-NNNN): dropped")
                continue
            if utt in listed:
                report(f"{where}: utterance {utt} listed twice (first on {listed[utt]}): dropped this line")
                continue
            listed[utt] = where
            flac = tf.parent / f"{utt}.flac"
            seen_flac.add(flac)
            if not words:
                report(f"{where}: empty transcript for {utt}: dropped")
                continue
            if not flac.is_file():
                report(f"{where}: {utt}: audio file missing: {flac}: dropped")
                continue
            try:
                info = sf.info(str(flac))
            except Exception as e:  # noqa: BLE001 - any decoder error means the file is unusable
                report(f"{where}: {utt}: unreadable audio {flac} ({type(e).__name__}: {e}): dropped")
                continue
            if info.frames <= 0:
                report(f"{where}: {utt}: empty audio {flac}: dropped")
                continue
            wav[utt] = str(flac.resolve())
            text[utt] = words
            utt2spk[utt] = reader if speaker == "reader" else f"{reader}-{chapter}"
            utt2dur[utt] = info.frames / info.samplerate
    for flac in sorted(src.glob("*/*/*.flac")):
        if flac not in seen_flac:
            report(f"{flac}: audio without a transcript line in {flac.parent}: left out")
    if not wav:
        raise PrepError(f"{src}: no usable utterances ({len(problems)} problems reported above)")
    out.mkdir(parents=True, exist_ok=True)
    write_table(out / "wav.scp", wav)
    write_table(out / "text", text)
    write_table(out / "utt2spk", utt2spk)
    write_spk2utt(out / "spk2utt", utt2spk_to_spk2utt(utt2spk))
    write_table(out / "utt2dur", {u: f"{d:.4f}".rstrip("0").rstrip(".") for u, d in utt2dur.items()})
    genders = read_speakers_txt(src)
    spks = sorted(set(utt2spk.values()))
    if genders:
        g = {s: genders.get(s.split("-")[0]) for s in spks}
        if all(g.values()):
            write_spk2gender(out / "spk2gender", g)
        else:
            report(f"SPEAKERS.TXT lacks the gender of {sum(v is None for v in g.values())} speaker(s): no spk2gender")
    elif (out / "spk2gender").exists():
        (out / "spk2gender").unlink()
    return {"utterances": len(wav), "speakers": len(spks), "hours": sum(utt2dur.values()) / 3600,
            "problems": len(problems)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True, help="a LibriSpeech subset folder, e.g. <root>/train-clean-100")
    ap.add_argument("--out", type=Path, required=True, help="the data directory to write, e.g. data/train_clean_100")
    ap.add_argument("--speaker", choices=("reader", "chapter"), default="reader",
                    help="speaker = <spk> (default) or <spk>-<chapter> (Kaldi's librispeech recipe)")
    args = ap.parse_args(argv)
    try:
        s = prepare(args.src, args.out, args.speaker)
    except PrepError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None
    dropped = f"; {s['problems']} problem(s) reported above" if s["problems"] else ""
    print(f"{PROG}: {args.out}: {s['utterances']} utterances, {s['speakers']} speakers, "
          f"{s['hours']:.2f} h{dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
