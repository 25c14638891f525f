#!/usr/bin/env python3
"""Switchboard-1 Release 2 (LDC97S62) + the MS-State transcripts -> a Kaldi data dir (Kaldi's
``egs/swbd/s5c/local/swbd1_data_prep.sh`` in Python, lower case as s5c).

    python local/swbd1_data_prep.py --swbd-root /data/LDC97S62 --out data/train
    python local/swbd1_data_prep.py --swbd-root /data/LDC97S62 --transcripts /data/swb_ms98_transcriptions \\
        --wav-style sph2pipe --out data/train

Input: every ``*.sph`` under ``--swbd-root`` (``sw02001.sph``: 8 kHz, 2 channels, shortened
mu-law), and every ``*-trans.text`` under ``--transcripts`` (default: the
``swb_ms98_transcriptions`` folder found under ``--swbd-root``, or beside it), lines
``sw2001A-ms98-a-0001 0.000000 0.977625 words...``.

Output, each file sorted (C order):

* ``segments``: ``sw02001-A_000098-001156 sw02001-A 0.98 11.56`` (utterance id from side and
  times in centiseconds, as Kaldi);
* ``wav.scp``, one line per recording = conversation side (``sw02001-A``, ``sw02001-B``):
  ``--wav-style path`` (default) the .sph path itself: gossip_accel reads shortened SPHERE and
  takes the side's channel from ``reco2file_and_channel``; ``sph2pipe``: Kaldi's
  ``sph2pipe -f wav -p -c 1 <sph> |``; ``sox``: ``sox <sph> -t wav -e signed -b 16 - remix 1 |``
  (sox cannot read shortened files: only for uncompressed copies). The two pipe styles are
  commands that ``gossip_accel.bin.compute_fbank`` runs only with ``--allow-pipes`` (it refuses
  to execute text from a data file otherwise, naming the line; docs/RELIABILITY.md);
* ``reco2file_and_channel``: ``sw02001-A sw02001 A`` (side A = channel 1, B = channel 2);
* ``text`` (normalized, see :func:`map_words`), ``utt2spk`` (speaker = conversation side, as
  in Kaldi), ``spk2utt``.

Normalization (swbd1_map_words.pl and s5c's data prep): ``[silence]``, ``<b_aside>``,
``<e_aside>`` removed; ``[laughter-word]`` -> ``word``; partial words ``th[e]-`` -> ``th-`` and
``[ex]cept`` / ``-[ex]cept`` -> ``-cept``; mispronunciations ``[bocket/bucket]`` -> ``bucket``;
coinages ``{yuppiedom}`` -> ``yuppiedom``; ``word_1`` -> ``word``; everything lower case;
``[noise]``, ``[laughter]``, ``[vocalized-noise]`` are kept (the model learns them; scoring
removes them, see local/wer_filter.py). Segments left empty are dropped (counted). Problems
(a transcript without audio, a repeated segment id, a line that does not parse) are reported
with file and line and left out; exit 1 only when nothing is left.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gossip_accel.data import kaldi as kd  # noqa: E402

PROG = "swbd1_data_prep.py"
_LINE = re.compile(r"^sw(\d{4})([AB])-ms98-a-(\d+)$", re.IGNORECASE)


def map_word(w: str) -> str:
    """One MS-State token -> its normalized form ('' = drop)."""
    w = w.lower()
    if w in ("[silence]", "<b_aside>", "<e_aside>"):
        return ""
    m = re.fullmatch(r"\[laughter-(.+)\]", w)
    if m:
        w = m.group(1)
    if w in ("[noise]", "[laughter]", "[vocalized-noise]"):
        return w
    m = re.fullmatch(r"\[([^/\]]+)/([^\]]+)\]", w)          # [bocket/bucket]: what was meant
    if m:
        return m.group(2)
    m = re.fullmatch(r"(.*?)\[[^\]]*\]-", w)                 # th[e]- -> th-
    if m:
        return m.group(1) + "-" if m.group(1) else ""
    m = re.fullmatch(r"-?\[[^\]]*\](.*)", w)                 # [ex]cept, -[ex]cept -> -cept
    if m:
        return "-" + m.group(1) if m.group(1) else ""
    w = re.sub(r"^\{(.*)\}$", r"\1", w)                      # {coinage}
    w = re.sub(r"_\d+$", "", w)                              # i_1
    return w


def map_words(words: str) -> str:
    return " ".join(x for x in (map_word(w) for w in words.split()) if x)


def find_files(root: Path, pattern: str) -> list[Path]:
    out = []
    for dirpath, _, files in os.walk(root, followlinks=True):
        for f in files:
            if re.fullmatch(pattern, f, re.IGNORECASE):
                out.append(Path(dirpath) / f)
    return sorted(out)


def wav_value(sph: Path, side: str, style: str) -> str:
    ch = "1" if side == "A" else "2"
    if style == "path":
        return str(sph)
    if style == "sph2pipe":
        return f"sph2pipe -f wav -p -c {ch} {sph} |"
    if style == "sox":
        return f"sox {sph} -t wav -e signed-integer -b 16 - remix {ch} |"
    raise ValueError(f"unknown --wav-style {style!r}")


def prepare(swbd_root: Path, transcripts: Path, out: Path, wav_style: str = "path", log=sys.stderr) -> dict:
    sph = {p.stem.lower(): p.resolve() for p in find_files(swbd_root, r".*\.sph")}
    if not sph:
        raise SystemExit(f"{PROG}: no .sph files under {swbd_root} (expected LDC97S62's swb1_d*/data/sw0NNNN.sph)")
    files = find_files(transcripts, r".*-trans\.text")
    if not files:
        raise SystemExit(f"{PROG}: no *-trans.text under {transcripts} (expected swb_ms98_transcriptions/NN/NNNN/...)")
    text, segments, reported = {}, {}, Counter()
    first_line: dict[str, str] = {}
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            parts = line.split()
            if not parts:
                continue
            m = _LINE.match(parts[0])
            try:
                start, end = float(parts[1]), float(parts[2])
            except (IndexError, ValueError):
                m = None
            if not m:
                print(f"{PROG}: {f}:{n}: not '<swNNNN[AB]-ms98-a-NNNN> <start> <end> words': dropped", file=log)
                reported["bad line"] += 1
                continue
            conv, side = f"sw0{m.group(1)}", m.group(2).upper()
            words = map_words(" ".join(parts[3:]))
            if not words:
                reported["empty after normalization"] += 1
                continue
            if conv not in sph:
                if not reported[f"no audio {conv}"]:
                    print(f"{PROG}: {f}: no {conv}.sph under {swbd_root}: its segments are dropped", file=log)
                reported[f"no audio {conv}"] += 1
                continue
            if end <= start:
                print(f"{PROG}: {f}:{n}: end {end} <= start {start}: dropped", file=log)
                reported["bad times"] += 1
                continue
            reco = f"{conv}-{side}"
            utt = f"{reco}_{int(100 * start + 0.5):06d}-{int(100 * end + 0.5):06d}"
            if utt in text:
                print(f"{PROG}: {f}:{n}: segment {utt} already seen ({first_line[utt]}): dropped", file=log)
                reported["duplicate"] += 1
                continue
            first_line[utt] = f"{f.name}:{n}"
            text[utt] = words
            segments[utt] = (reco, start, end)
    if not text:
        raise SystemExit(f"{PROG}: no usable segment in {transcripts}")
    recos = sorted({r for r, _, _ in segments.values()})
    out.mkdir(parents=True, exist_ok=True)
    kd.write_text(out / "text", text)
    kd.write_segments(out / "segments", segments)
    utt2spk = {u: r for u, (r, _, _) in segments.items()}
    kd.write_utt2spk(out / "utt2spk", utt2spk)
    kd.write_spk2utt(out / "spk2utt", kd.utt2spk_to_spk2utt(utt2spk))
    kd.write_wav_scp(out / "wav.scp", {r: wav_value(sph[r[:-2]], r[-1], wav_style) for r in recos})
    kd.write_reco2file_and_channel(out / "reco2file_and_channel", {r: (r[:-2], r[-1]) for r in recos})
    for stale in ("feats.scp", "utt2num_frames", "utt2dur", "spk2gender", ".fbank.done"):
        (out / stale).unlink(missing_ok=True)
    return {"utterances": len(text), "recordings": len(recos), "conversations": len({r[:-2] for r in recos}),
            "left_out": dict(reported)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--swbd-root", type=Path, required=True, help="LDC97S62 (the .sph files are searched below it)")
    ap.add_argument("--transcripts", type=Path, default=None,
                    help="swb_ms98_transcriptions (default: found under --swbd-root or beside it)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--wav-style", choices=("path", "sph2pipe", "sox"), default="path")
    args = ap.parse_args(argv)
    tr = args.transcripts
    if tr is None:
        for cand in (args.swbd_root / "swb_ms98_transcriptions", args.swbd_root.parent / "swb_ms98_transcriptions",
                     args.swbd_root / "transcriptions" / "swb_ms98_transcriptions"):
            if cand.is_dir():
                tr = cand
                break
        else:
            ap.error(f"no swb_ms98_transcriptions under or beside {args.swbd_root}: give --transcripts "
                     f"(the MS-State transcripts, swb_ms98_transcriptions.tar.gz from ISIP)")
    stats = prepare(args.swbd_root, tr, args.out, args.wav_style)
    print(f"{PROG}: {args.out}: {stats['utterances']} segments of {stats['recordings']} conversation sides "
          f"({stats['conversations']} conversations); left out: {stats['left_out'] or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
