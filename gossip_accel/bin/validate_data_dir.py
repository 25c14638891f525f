"""Check a Kaldi data directory; print every problem (file and line); exit 1 if there is any.

    python -m gossip_accel.bin.validate_data_dir data/train_clean_100
    python -m gossip_accel.bin.validate_data_dir --need "wav.scp text utt2spk spk2utt feats.scp" data/x
    python -m gossip_accel.bin.validate_data_dir --no-check-audio data/x    # skip the wav.scp path checks

What is checked: see ``gossip_accel.data.kaldi.validate.validate_data_dir``. Shell entry point:
``utils/validate_data_dir.sh``.
"""
from __future__ import annotations

import argparse
import sys

from ..data.kaldi.tables import DEFAULT_NEED, KNOWN_FILES, read_table
from ..data.kaldi.validate import validate_data_dir


def parse_need(values: list[str] | None) -> list[str]:
    if not values:
        return list(DEFAULT_NEED)
    out = [f for v in values for f in v.replace(",", " ").split()]
    unknown = [f for f in out if f not in KNOWN_FILES]
    if unknown:
        raise SystemExit(f"validate_data_dir: unknown file(s) in --need: {' '.join(unknown)} "
                         f"(known: {' '.join(KNOWN_FILES)})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="validate_data_dir", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--need", action="append", metavar="FILES",
                    help=f"files that must exist, space- or comma-separated (default: {' '.join(DEFAULT_NEED)})")
    ap.add_argument("--no-check-audio", action="store_true", help="do not check that wav.scp/feats.scp files exist")
    ap.add_argument("--audio-base", default=None, help="relative paths in wav.scp are relative to this (default: cwd)")
    args = ap.parse_args(argv)
    problems = validate_data_dir(args.dir, parse_need(args.need), not args.no_check_audio, args.audio_base)
    if problems:
        for p in problems:
            print(f"validate_data_dir: {p}", file=sys.stderr)
        print(f"validate_data_dir: {args.dir}: INVALID ({len(problems)} problem line(s) above; "
              f"utils/fix_data_dir.sh {args.dir} drops the inconsistent utterances)", file=sys.stderr)
        return 1
    try:
        u2s = read_table(f"{args.dir}/utt2spk")
        summary = f"{len(u2s)} utterances, {len(set(u2s.values()))} speakers"
    except Exception:  # noqa: BLE001 - utt2spk may not be required
        summary = "no utt2spk"
    print(f"validate_data_dir: {args.dir}: OK ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
