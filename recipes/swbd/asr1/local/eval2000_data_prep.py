#!/usr/bin/env python3
"""Hub5'00 English (eval2000: speech LDC2002S09, transcripts LDC2002T43) -> Kaldi data dirs, the
whole set and its two halves scored apart: Switchboard (``sw_*``) and CallHome (``en_*``).
(Kaldi's ``egs/swbd/s5c/local/eval2000_data_prep.sh`` in Python.)

    python local/eval2000_data_prep.py --speech /data/LDC2002S09/hub5e_00 --transcripts /data/LDC2002T43 \\
        --out data/eval2000            # also writes data/eval2000_swbd and data/eval2000_callhome

Input: ``english/*.sph`` and ``english/hub5e_00.pem`` (the segmentation, lines
``en_4156 A en_4156_A 301.85 302.48``) under ``--speech``; ``reference/hub5e00.english.000405.stm``
under ``--transcripts`` (``en_4156 A en_4156_A 301.85 302.48 <O,en,F,en-F> words``; files are
searched for by name below both folders).

Output: ``segments`` from the PEM (utterance ``en_4156-A_030185-030248``, recording =
conversation side), ``text`` from the STM (words lower case, as they are: ``(%hesitation)``,
``(th-)`` and other optionally deletable words are kept in the reference and removed at scoring
by local/wer_filter.py, like NIST's GLM/STM scoring; segments marked
``IGNORE_TIME_SEGMENT_IN_SCORING`` have no text and are dropped, as are PEM segments without an
STM line: both are counted), ``wav.scp`` (``--wav-style`` as in swbd1_data_prep.py),
``reco2file_and_channel`` (A = channel 1), ``utt2spk`` (speaker = side), ``spk2utt``, and
copies of the ``stm`` and ``glm`` for NIST's sclite/hubscr. ``<out>_swbd`` and
``<out>_callhome`` hold the same for the sw_ and en_ conversations.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[3]))
from swbd1_data_prep import find_files, wav_value  # noqa: E402
from gossip_accel.data import kaldi as kd  # noqa: E402

PROG = "eval2000_data_prep.py"
IGNORE = "IGNORE_TIME_SEGMENT_IN_SCORING"


def utt_id(conv: str, side: str, start: float, end: float) -> str:
    return f"{conv}-{side}_{round(100 * start):06d}-{round(100 * end):06d}"


def read_rows(path: Path, min_fields: int):
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip() or line.startswith(";;"):
            continue
        f = line.split()
        if len(f) < min_fields:
            yield n, None
            continue
        try:
            yield n, (f[0].lower(), f[1].upper(), float(f[3]), float(f[4]), f[5:])
        except ValueError:
            yield n, None


def write_dir(out: Path, keep, text, segments, sph, wav_style, extra_files) -> int:
    utts = sorted(u for u in segments if keep(u))
    out.mkdir(parents=True, exist_ok=True)
    segs = {u: segments[u] for u in utts}
    recos = sorted({r for r, _, _ in segs.values()})
    kd.write_text(out / "text", {u: text[u] for u in utts})
    kd.write_segments(out / "segments", segs)
    u2s = {u: segs[u][0] for u in utts}
    kd.write_utt2spk(out / "utt2spk", u2s)
    kd.write_spk2utt(out / "spk2utt", kd.utt2spk_to_spk2utt(u2s))
    kd.write_wav_scp(out / "wav.scp", {r: wav_value(sph[r[:-2]], r[-1], wav_style) for r in recos})
    kd.write_reco2file_and_channel(out / "reco2file_and_channel", {r: (r[:-2], r[-1]) for r in recos})
    for name, src in extra_files.items():
        shutil.copyfile(src, out / name)
    for stale in ("feats.scp", "utt2num_frames", ".fbank.done"):
        (out / stale).unlink(missing_ok=True)
    return len(utts)


def prepare(speech: Path, transcripts: Path, out: Path, wav_style: str = "path", log=sys.stderr) -> dict:
    sph = {p.stem.lower(): p.resolve() for p in find_files(speech, r"(sw|en)_\d+\.sph")}
    pems = find_files(speech, r"hub5e_00\.pem")
    stms = find_files(transcripts, r"hub5e00\.english\..*\.stm")
    glms = find_files(transcripts, r".*\.glm")
    if not sph or not pems or not stms:
        raise SystemExit(f"{PROG}: need english/*.sph and hub5e_00.pem under {speech} ({len(sph)} .sph, "
                         f"{len(pems)} pem found) and reference/hub5e00.english.*.stm under {transcripts} ({len(stms)} found)")
    counts = Counter()
    segments = {}
    for n, row in read_rows(pems[0], 5):
        if row is None:
            print(f"{PROG}: {pems[0]}:{n}: not '<conv> <side> <spk> <start> <end>': dropped", file=log)
            counts["bad pem line"] += 1
            continue
        conv, side, start, end, _ = row
        if conv not in sph:
            counts["pem segment without audio"] += 1
            continue
        segments[utt_id(conv, side, start, end)] = (f"{conv}-{side}", start, end)
    text = {}
    for n, row in read_rows(stms[0], 6):
        if row is None:
            print(f"{PROG}: {stms[0]}:{n}: not an STM line: dropped", file=log)
            counts["bad stm line"] += 1
            continue
        conv, side, start, end, rest = row
        words = [w.lower() for w in (rest[1:] if rest and rest[0].startswith("<") else rest)]
        if not words or words == [IGNORE.lower()]:
            counts["ignored in scoring (IGNORE_TIME_SEGMENT_IN_SCORING)"] += 1
            continue
        text[utt_id(conv, side, start, end)] = " ".join(words)
    no_text = [u for u in segments if u not in text]
    no_seg = [u for u in text if u not in segments]
    if no_seg:
        print(f"{PROG}: {len(no_seg)} STM segments have no PEM segment (first: {no_seg[0]}): left out", file=log)
        counts["stm segment not in pem"] += len(no_seg)
    for u in no_text:
        del segments[u]
    counts["pem segment without scored text"] += len(no_text)
    extra = {"stm": stms[0], **({"glm": glms[0]} if glms else {})}
    sizes = {}
    for name, keep in ((out, lambda u: True), (out.with_name(out.name + "_swbd"), lambda u: u.startswith("sw_")),
                       (out.with_name(out.name + "_callhome"), lambda u: u.startswith("en_"))):
        sizes[name.name] = write_dir(name, keep, text, segments, sph, wav_style, extra)
    return {"sizes": sizes, "left_out": dict(counts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--speech", type=Path, required=True, help="LDC2002S09 (or its hub5e_00 folder)")
    ap.add_argument("--transcripts", type=Path, required=True, help="LDC2002T43")
    ap.add_argument("--out", type=Path, required=True, help="data/eval2000 (+ _swbd, _callhome beside it)")
    ap.add_argument("--wav-style", choices=("path", "sph2pipe", "sox"), default="path")
    args = ap.parse_args(argv)
    stats = prepare(args.speech, args.transcripts, args.out, args.wav_style)
    print(f"{PROG}: " + ", ".join(f"{k}: {v} segments" for k, v in stats["sizes"].items())
          + f"; left out: {stats['left_out'] or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
