"""Train the CTC output units (sentencepiece BPE or characters) on a data dir's transcripts.

    python -m gossip_accel.bin.train_units --text data/train/text --lang-dir data/lang_bpe_500 [--unit-type bpe] [--vocab-size 500]

Writes ``<lang-dir>/bpe.model`` (also for ``--unit-type char``) and ``<lang-dir>/tokens.txt``
(``<symbol> <id>``; ``<blk>`` = 0 is the CTC blank, ``<unk>`` = 1, units from 2). The
vocabulary size counts both; 500 suits LibriSpeech 960 h, take 300 for the mini corpus.
Deterministic. Load with ``gossip_accel.data.units.Tokenizer(lang_dir)``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..data.units import DEFAULT_BPE_VOCAB, UNIT_TYPES, train_units


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, help="Kaldi text file (<utt> <transcript>) of the training set")
    ap.add_argument("--lang-dir", required=True)
    ap.add_argument("--unit-type", choices=UNIT_TYPES, default="bpe")
    ap.add_argument("--vocab-size", type=int, default=DEFAULT_BPE_VOCAB,
                    help="bpe only: number of units including <blk> and <unk>")
    ap.add_argument("--character-coverage", type=float, default=1.0)
    args = ap.parse_args(argv)
    if not Path(args.text).is_file():
        raise SystemExit(f"train_units: {args.text} not found: give the training set's Kaldi text file (<utt> <transcript>)")
    try:
        tok = train_units(args.text, args.lang_dir, args.unit_type, args.vocab_size, args.character_coverage)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"train_units: {e}") from None
    print(f"train_units: {args.lang_dir}/bpe.model, tokens.txt: {tok.vocab_size} {args.unit_type} units "
          f"(<blk>=0, <unk>=1)", file=sys.stderr)


if __name__ == "__main__":
    main()
