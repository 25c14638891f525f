#!/usr/bin/env python3
"""Split Switchboard's training data dir as Kaldi's s5c does: the first N utterances (whole
conversation sides, in utterance order) become the dev set, the rest the training set, from
which repeated transcripts beyond --max-dup copies are removed ("uh-huh" x 3000: Kaldi's
utils/data/remove_dup_utts.sh 300, which gives train_nodup).

    python local/split_train_dev.py --src data/train --dev data/train_dev --train data/train_nodup \\
        --dev-utts 4000 --max-dup 300

Every table of the source (text, segments, utt2spk, wav.scp, reco2file_and_channel...) is
subset; spk2utt is rebuilt; recordings no longer used are dropped from wav.scp.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gossip_accel.data import kaldi as kd  # noqa: E402

PROG = "split_train_dev.py"


def subset(src: Path, dst: Path, utts: set[str]) -> int:
    dst.mkdir(parents=True, exist_ok=True)
    segs = kd.read_table(src / "segments") if (src / "segments").is_file() else None
    recos = {v.split()[0] for u, v in segs.items() if u in utts} if segs is not None else utts
    for name in ("text", "utt2spk", "segments", "utt2dur", "utt2num_frames", "feats.scp"):
        if (src / name).is_file():
            kd.write_table(dst / name, {k: v for k, v in kd.read_table(src / name).items() if k in utts})
    for name in ("wav.scp", "reco2file_and_channel"):
        if (src / name).is_file():
            kd.write_table(dst / name, {k: v for k, v in kd.read_table(src / name).items() if k in recos})
    u2s = kd.read_utt2spk(dst / "utt2spk")
    kd.write_spk2utt(dst / "spk2utt", kd.utt2spk_to_spk2utt(u2s))
    for stale in (".fbank.done",):
        (dst / stale).unlink(missing_ok=True)
    return len(u2s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--dev", type=Path, required=True)
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--dev-utts", type=int, default=4000)
    ap.add_argument("--max-dup", type=int, default=300, help="copies of one transcript kept in --train (0: no limit)")
    args = ap.parse_args(argv)
    text = kd.read_text(args.src / "text")
    utts = sorted(text)
    if args.dev_utts >= len(utts):
        ap.error(f"--dev-utts {args.dev_utts} leaves nothing to train on ({len(utts)} utterances)")
    dev, rest = set(utts[:args.dev_utts]), utts[args.dev_utts:]
    seen: Counter = Counter()
    train = set()
    for u in rest:
        seen[text[u]] += 1
        if not args.max_dup or seen[text[u]] <= args.max_dup:
            train.add(u)
    nd, nt = subset(args.src, args.dev, dev), subset(args.src, args.train, train)
    print(f"{PROG}: {args.dev}: {nd} utterances; {args.train}: {nt} utterances "
          f"({len(rest) - nt} repeated transcripts beyond {args.max_dup} copies removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
