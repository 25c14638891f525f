"""Score hypotheses against reference transcripts: Kaldi-format WER, per-utterance alignments.

    python -m gossip_accel.bin.score_wer --ref data/test_clean/text --hyp exp/x/decode_test_clean/hyp.txt --out-dir exp/x/decode_test_clean/scoring [--mode all]

Both files are Kaldi ``text`` files (``<utt> <words...>``). Writes ``<out-dir>/wer``
(``%WER``, ``%SER`` and ``Scored`` lines exactly as ``compute-wer``), ``<out-dir>/per_utt``
(``wer_per_utt_details.pl`` format), and the scored ``hyp.txt`` / ``ref.txt``; prints the
``wer`` lines. ``--mode all`` (default) counts a missing hypothesis as empty (all deletions,
``[PARTIAL]`` on the %WER line); ``present`` skips it; ``strict`` stops.
"""
from __future__ import annotations

import argparse
import sys

from ..asr.scoring import MODES, write_scoring_dir
from ..data.kaldi.tables import read_table as read_kaldi_map


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", required=True, help="reference text (<utt> <words>)")
    ap.add_argument("--hyp", required=True, help="hypothesis text (<utt> <words>)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--mode", choices=MODES, default="all")
    args = ap.parse_args(argv)
    try:
        refs, hyps = read_kaldi_map(args.ref), read_kaldi_map(args.hyp)
        stats = write_scoring_dir(args.out_dir, refs, hyps, args.mode)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise SystemExit(f"score_wer: {e.args[0] if isinstance(e, KeyError) else e}") from None
    if stats.extra:
        print(f"score_wer: WARNING: {len(stats.extra)} hypotheses have no reference in {args.ref} and were not "
              f"scored (first: {stats.extra[0]})", file=sys.stderr)
    if stats.absent:
        print(f"score_wer: WARNING: {stats.absent} references have no hypothesis in {args.hyp} "
              f"({'counted as empty' if args.mode == 'all' else 'not scored'})", file=sys.stderr)
    print("\n".join(stats.kaldi_lines()))


if __name__ == "__main__":
    main()
