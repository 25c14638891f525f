"""Make a Kaldi data directory consistent; report every utterance dropped and why.

    python -m gossip_accel.bin.fix_data_dir data/train_clean_100
    python -m gossip_accel.bin.fix_data_dir --no-check-audio data/x     # do not drop utterances for missing audio

Keeps the utterances present in every utterance table with a non-empty transcript and an
existing audio file, rebuilds spk2utt, sorts every file (see
``gossip_accel.data.kaldi.fix.fix_data_dir``). Originals are copied to ``<dir>/.backup/``,
the dropped utterances and reasons go to stderr and ``<dir>/.backup/dropped.txt``. Then the
directory is validated: exit 1 if problems remain (e.g. speaker ids that do not prefix the
utterance ids) or no utterance is left. Shell entry point: ``utils/fix_data_dir.sh``.
"""
from __future__ import annotations

import argparse
import sys

from ..data.kaldi.fix import fix_data_dir
from ..data.kaldi.tables import DataDirError
from ..data.kaldi.validate import validate_data_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fix_data_dir", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--no-check-audio", action="store_true", help="keep utterances whose audio file is missing")
    ap.add_argument("--audio-base", default=None, help="relative paths in wav.scp are relative to this (default: cwd)")
    args = ap.parse_args(argv)
    try:
        rep = fix_data_dir(args.dir, not args.no_check_audio, args.audio_base)
    except DataDirError as e:
        print(f"fix_data_dir: error: {e}", file=sys.stderr)
        return 1
    if rep.kept == 0:
        print(f"fix_data_dir: {args.dir}: error: no utterance left", file=sys.stderr)
        return 1
    need = [f for f in ("utt2spk", "spk2utt")]
    problems = validate_data_dir(args.dir, need, not args.no_check_audio, args.audio_base)
    if problems:
        for p in problems:
            print(f"fix_data_dir: still invalid: {p}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
