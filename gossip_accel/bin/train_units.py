"""Train the CTC output units (sentencepiece BPE, characters or a lexicon's phones) on a data dir's transcripts.

    python -m gossip_accel.bin.train_units --text data/train/text --lang-dir data/lang_bpe_500 [--unit-type bpe] [--vocab-size 500]
    python -m gossip_accel.bin.train_units --text data/train/text --lang-dir data/lang_phone --unit-type phone \
        [--lexicon librispeech-lexicon.txt] [--g2p flite]

Writes ``<lang-dir>/bpe.model`` (also for ``--unit-type char``) and ``<lang-dir>/tokens.txt``
(``<symbol> <id>``; ``<blk>`` = 0 is the CTC blank, ``<unk>`` = 1, units from 2). The
vocabulary size counts both; 500 suits LibriSpeech 960 h, take 300 for the mini corpus.
Deterministic. ``--unit-type phone`` writes ``lexicon.txt`` (the lexicon's entries, and the G2P's for
the training words it lacks), ``tokens.txt`` and ``units.json`` instead. Load either with
``gossip_accel.data.units.load_units(lang_dir)``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..data.g2p import G2P_METHODS
from ..data.units import DEFAULT_BPE_VOCAB, UNIT_TYPES, train_units


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, help="Kaldi text file (<utt> <transcript>) of the training set")
    ap.add_argument("--lang-dir", required=True)
    ap.add_argument("--unit-type", choices=UNIT_TYPES, default="bpe")
    ap.add_argument("--vocab-size", type=int, default=DEFAULT_BPE_VOCAB,
                    help="bpe only: number of units including <blk> and <unk>")
    ap.add_argument("--character-coverage", type=float, default=1.0)
    ap.add_argument("--lexicon", default=None, help="phone only: WORD PH1 PH2 ... per line (librispeech-lexicon.txt)")
    ap.add_argument("--g2p", choices=G2P_METHODS, default=None,
                    help="phone only: pronounce the training words the lexicon lacks (flite: flite's t2p)")
    args = ap.parse_args(argv)
    if args.unit_type != "phone" and (args.lexicon or args.g2p):
        raise SystemExit(f"train_units: --lexicon and --g2p are for --unit-type phone, not {args.unit_type}")
    if not Path(args.text).is_file():
        raise SystemExit(f"train_units: {args.text} not found: give the training set's Kaldi text file (<utt> <transcript>)")
    try:
        tok = train_units(args.text, args.lang_dir, args.unit_type, args.vocab_size, args.character_coverage,
                          args.lexicon, args.g2p)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"train_units: {e}") from None
    if args.unit_type == "phone":
        m = tok.meta
        print(f"train_units: {args.lang_dir}/lexicon.txt, tokens.txt: {tok.vocab_size - 2} phones (+ <blk>=0, <unk>=1); "
              f"{m['train_words']} training words, {m['train_words_by_g2p']} pronounced by {m['g2p']}, "
              f"{m['train_words_without_pronunciation']} without a pronunciation (<unk>)"
              + (f": {' '.join(m['examples_without'][:5])}" if m["examples_without"] else ""), file=sys.stderr)
        return
    print(f"train_units: {args.lang_dir}/bpe.model, tokens.txt: {tok.vocab_size} {args.unit_type} units "
          f"(<blk>=0, <unk>=1)", file=sys.stderr)


if __name__ == "__main__":
    main()
